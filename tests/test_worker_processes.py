"""Process workers and ``worker_type="auto"`` (issue 12): the same batches as torch's
loader, for every kind of ``__getitem__`` and each worker type; errors and dead workers
reported promptly; nothing left behind."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import torch
from _dl_helpers import MapData, assert_same_batches
from _sync import WAIT
from _worker_helpers import (
    Dies,
    Keyed,
    RandomDraws,
    SmallArrays,
    Staged,
    Stuck,
    Tokens,
    TorchWorkerInfo,
    Waits,
    failing_init,
    long_key_batches,
    stuck_init,
)
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

from torch_spdl import DataLoader, PipelineBuilder, StagedDataset
from torch_spdl.data import WorkerFailure
from torch_spdl.data._epoch.thread_or_process import Measurement, decide

WORKER_TYPES = ["auto", "thread", "process"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def quiet_worker_count_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        yield


def shared_memory() -> set[str]:
    """The loader's shared memory this process still holds: its arenas are ``memfd`` files
    (open or mapped here, never named in /dev/shm), and anything it would name there."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "torch_spdl" in target:
            held.add(target)
    with open("/proc/self/maps") as maps:
        held.update(line.split(None, 5)[-1].strip() for line in maps if "torch_spdl" in line)
    return held | {f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if "torch_spdl" in n}


def snapshot() -> tuple[set[int], set[threading.Thread], set[str]]:
    """Child processes, threads and shared memory."""
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    return children, set(threading.enumerate()), shared_memory()


def leftovers(before: tuple[set[int], set[threading.Thread], set[str]]) -> list[str]:
    """What is there now and was not before (waiting a bounded time for what is on its way
    out)."""
    children, threads, shm = before
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in children]
    _, alive = psutil.wait_procs(new, timeout=WAIT)
    left = [f"process {p.pid}" for p in alive]
    for t in set(threading.enumerate()) - threads:
        t.join(WAIT)
        if t.is_alive():
            left.append(f"thread {t.name}")
    return left + sorted(shared_memory() - shm)


@pytest.fixture
def nothing_left() -> Iterator[None]:
    before = snapshot()
    yield
    gc.collect()
    assert not leftovers(before)


# -- the same batches as torch --------------------------------------------------------------
DATASETS = {
    "tokens": (lambda: Tokens(40), 4),
    "small_arrays": (lambda: SmallArrays(40), 8),
    "ints": (lambda: MapData(37, "int"), 5),
    "dicts": (lambda: MapData(30, "dict"), 4),
}


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
@pytest.mark.parametrize("name", list(DATASETS))
def test_batches_equal_torchs(name: str, worker_type: str) -> None:
    make, batch = DATASETS[name]
    ref = TorchDataLoader(make(), batch_size=batch, shuffle=True, generator=gen(5))
    ours = DataLoader(
        make(),
        batch_size=batch,
        shuffle=True,
        generator=gen(5),
        num_workers=2,
        worker_type=worker_type,
    )
    for _ in range(2):  # the second epoch runs on what "auto" chose
        assert_same_batches(list(ours), list(ref))


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_random_draws_in_workers_equal_torchs_worker_processes(num_workers: int) -> None:
    """Seeds and the batch-to-worker assignment follow torch, so the draws match."""
    ref = list(
        TorchDataLoader(RandomDraws(24), batch_size=3, num_workers=num_workers, generator=gen(1))
    )
    ours = DataLoader(
        RandomDraws(24),
        batch_size=3,
        num_workers=num_workers,
        worker_type="process",
        generator=gen(1),
    )
    assert_same_batches(list(ours), ref)


def test_torch_get_worker_info_in_worker_processes_equals_torchs() -> None:
    ref = list(TorchDataLoader(TorchWorkerInfo(), batch_size=2, num_workers=2, generator=gen(3)))
    ours = DataLoader(
        TorchWorkerInfo(), batch_size=2, num_workers=2, worker_type="process", generator=gen(3)
    )
    assert_same_batches(list(ours), ref)


def test_batch_size_none_in_processes_equals_torch() -> None:
    ref = list(TorchDataLoader(MapData(9, "dict"), batch_size=None, num_workers=2))
    ours = DataLoader(MapData(9, "dict"), batch_size=None, num_workers=2, worker_type="process")
    assert_same_batches(list(ours), ref)


def test_staged_dataset_loads_and_processes_in_the_workers() -> None:
    loader = DataLoader(Staged(12), batch_size=4, num_workers=2, worker_type="process")
    batches = list(loader)
    assert [b["i"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    loads = [pid for b in batches for pid in b["load_pid"].tolist()]
    workers = [pid for b in batches for pid in b["process_pid"].tolist()]
    assert loads == workers  # each sample loaded where it was processed
    assert os.getpid() not in workers and len(set(workers)) == 2
    del batches


# -- worker_type="auto" -----------------------------------------------------------------------
def measured(cores: float, share: float, batch_bytes: float = 0.0) -> Measurement:
    """A window of 1 s, 1000 samples in 100 batches, ``cores`` cores busy in
    ``__getitem__``, which spends ``share`` of its wall time on the CPU."""
    return Measurement(1000, 100, 1.0, cores / share, cores, batch_bytes)


def test_auto_chooses_processes_when_the_gil_is_the_bottleneck() -> None:
    choice = decide(measured(0.97, 0.5), num_workers=2, batch_size=32, cores=2)
    assert choice.kind == "process" and "holds the GIL" in choice.reason


def test_auto_keeps_threads_when_the_work_runs_in_parallel() -> None:
    choice = decide(measured(1.8, 0.95), num_workers=2, batch_size=32, cores=2)
    assert (choice.kind, choice.threads, choice.per_batch) == ("thread", 2, True)
    assert "parallel" in choice.reason


def test_auto_keeps_threads_on_one_core_whatever_holds_the_gil() -> None:
    assert decide(measured(0.9, 0.9), num_workers=4, batch_size=32, cores=1).kind == "thread"


def test_auto_keeps_threads_when_a_batch_is_cheaper_than_moving_it() -> None:
    cheap = Measurement(10_000, 100, 1.0, 1.0, 0.9, 0.0)  # 90 us of CPU per sample...
    assert decide(cheap, num_workers=2, batch_size=4, cores=2).kind == "thread"  # ...batch 4
    assert decide(cheap, num_workers=2, batch_size=8, cores=2).kind == "process"  # 0.72 ms
    large = Measurement(1000, 100, 1.0, 1.5, 0.9, 64e6)  # 29 ms a batch, 64 MB to move
    assert decide(large, num_workers=2, batch_size=32, cores=2).kind == "thread"
    smaller = Measurement(1000, 100, 1.0, 1.5, 0.9, 1e6)  # 1 MB to move
    assert decide(smaller, num_workers=2, batch_size=32, cores=2).kind == "process"


def test_auto_gives_waiting_work_more_threads_one_sample_each() -> None:
    choice = decide(measured(0.02, 0.01), num_workers=4, batch_size=16, cores=2)
    assert (choice.kind, choice.threads, choice.per_batch) == ("thread", 64, False)
    assert decide(measured(0.2, 0.2), num_workers=2, batch_size=16, cores=2).threads == 10
    no_more = decide(measured(0.02, 0.01), 4, 16, cores=2, more_threads=False)
    assert no_more.threads == 4


def test_auto_switches_once_to_more_threads_losing_and_repeating_nothing(caplog) -> None:
    """Waiting work is measured on batch threads, then the rest of the epoch moves to
    per-sample threads: every batch exactly once, in order, as torch gives them."""
    torch_loader = TorchDataLoader(Waits(160), batch_size=4, shuffle=True, generator=gen(9))
    ref = list(torch_loader)
    loader = DataLoader(
        Waits(160),
        batch_size=4,
        shuffle=True,
        generator=gen(9),
        num_workers=2,
        worker_type="auto",
    )
    with caplog.at_level(logging.INFO, logger="torch_spdl.data"):
        got = list(loader)
    assert_same_batches(got, ref)
    choice = loader.worker_choice
    assert choice is not None and choice.kind == "thread" and not choice.per_batch
    assert choice.threads > 2
    lines = [r.getMessage() for r in caplog.records if "worker_type='auto'" in r.getMessage()]
    assert len(lines) == 1 and "waits" in lines[0]
    assert_same_batches(list(loader), list(torch_loader))  # the next epoch: the chosen plan


def test_forced_worker_types_are_exposed() -> None:
    assert DataLoader(MapData(4), num_workers=2, worker_type="process").worker_choice.kind == (
        "process"
    )
    assert DataLoader(MapData(4), num_workers=2, worker_type="thread").worker_choice.kind == (
        "thread"
    )
    auto = DataLoader(MapData(4), num_workers=2, worker_type="auto")
    assert auto.worker_choice is None  # not measured yet
    # the default is torch's: worker processes
    assert DataLoader(MapData(4), num_workers=2).worker_choice.kind == "process"
    with pytest.raises(ValueError, match="worker_type"):
        DataLoader(MapData(4), worker_type="fiber")


# -- failures -------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_dead_worker_is_named_never_waited_for(how: str, nothing_left: None) -> None:
    loader = DataLoader(
        Dies(40, bad=13, how=how), batch_size=4, num_workers=2, worker_type="process"
    )
    got = []
    with pytest.raises(WorkerFailure, match="worker process 1") as exc:
        for batch in loader:
            got.extend(batch.tolist())
    assert ("SIGKILL" if how == "kill" else "exit code 3") in str(exc.value)
    assert got == list(range(12))  # every batch before the dead worker's
    del loader


@pytest.mark.parametrize("code", [0, 3])
def test_a_worker_that_exits_before_its_last_batch_is_named(code: int, nothing_left: None) -> None:
    # Once the last batch is sent, the workers are told to exit when they are done: one
    # that exits before it made its batches, even with code 0, still failed.
    loader = DataLoader(
        Dies(16, bad=15, how="exit", code=code),
        batch_size=2,
        num_workers=2,
        worker_type="process",
        timeout=WAIT,  # a lost batch fails the test instead of hanging it
    )
    got = []
    with pytest.raises(WorkerFailure, match=f"exit code {code}"):
        for batch in loader:
            got.extend(batch.tolist())
    assert got == list(range(14))
    del loader


class _FailsAtOnce:
    """A sampler whose first draw fails."""

    def __iter__(self) -> Iterator[int]:
        raise ValueError("no indices today")
        yield 0

    def __len__(self) -> int:
        return 4


def test_a_sampler_failing_at_its_first_draw_leaves_no_worker(nothing_left: None) -> None:
    # The workers fork before the sampler's first draw, as torch's do: its error, raised
    # from iter() as torch raises it, stops them.
    for make in (TorchDataLoader, DataLoader):
        loader = make(MapData(4), sampler=_FailsAtOnce(), num_workers=2)
        before = set(psutil.Process().children())  # the suite's servers, say
        with pytest.raises(ValueError, match="no indices today") as raised:
            iter(loader)
    # ours are gone while the error (and the frames its traceback holds) still lives
    assert raised.value is not None and set(psutil.Process().children()) <= before
    del loader, raised


def test_worker_init_fn_error_reaches_the_caller(nothing_left: None) -> None:
    loader = DataLoader(
        MapData(8), batch_size=2, num_workers=2, worker_type="process", worker_init_fn=failing_init
    )
    with pytest.raises(ValueError, match="cannot start") as exc:
        list(loader)
    assert any("worker_init_fn" in note for note in exc.value.__notes__)
    del loader


def test_sample_error_in_a_worker_keeps_its_type_index_and_worker() -> None:
    from _dl_helpers import ProcessBadData

    loader = DataLoader(
        ProcessBadData(12, bad=6), batch_size=4, num_workers=2, worker_type="process"
    )
    with pytest.raises(KeyError) as exc:
        list(loader)
    notes = "\n".join(exc.value.__notes__)
    assert "sample index 6" in notes and "worker process 1" in notes
    assert "traceback in the worker process" in notes


def test_max_failures_skips_samples_that_failed_in_workers() -> None:
    from _dl_helpers import ProcessBadData

    loader = DataLoader(
        ProcessBadData(12, bad=6),
        batch_size=4,
        num_workers=2,
        worker_type="process",
        max_failures=1,
    )
    batches = list(loader)
    assert [b["i"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 7], [8, 9, 10, 11]]
    assert loader.num_failures == 1


def test_timeout_with_a_stuck_worker_process(nothing_left: None) -> None:
    loader = DataLoader(
        Stuck(16, bad=4), batch_size=2, num_workers=2, worker_type="process", timeout=0.5
    )
    with pytest.raises(RuntimeError, match="timed out"):
        list(loader)
    del loader


def test_timeout_while_a_worker_never_reads_its_large_first_task(nothing_left: None) -> None:
    # Its first task (over 64 KiB) cannot be written while the worker is stuck in
    # worker_init_fn: the loader's timeout must still hold (the write is not the loop's).
    loader = DataLoader(
        Keyed(),
        batch_sampler=long_key_batches(4, 1500),
        num_workers=2,
        worker_type="process",
        worker_init_fn=stuck_init,
        timeout=0.5,
    )
    outcome: list[BaseException] = []

    def loop(loader: DataLoader) -> None:
        try:
            list(loader)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=loop, args=(loader,), daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "the loop hung writing the task"
    assert len(outcome) == 1 and "timed out" in str(outcome[0])
    del loader


# -- fork safety, and nothing left behind ----------------------------------------------------
def test_workers_fork_safely_while_other_pipelines_run(nothing_left: None) -> None:
    """Other pipelines' threads are busy (holding their locks) while the workers fork."""
    release = threading.Event()

    def busy(i: int) -> int:
        release.wait(WAIT)
        return i

    other = PipelineBuilder().add_source(range(100)).pipe(busy, concurrency=4).add_sink(2)
    pipeline = other.build()
    logger = logging.getLogger("torch_spdl.test.noise")
    stop = threading.Event()

    def noise() -> None:  # a thread taking the logging module's locks all the time
        while not stop.is_set():
            logger.debug("noise")

    noisy = threading.Thread(target=noise)
    noisy.start()
    try:
        with pipeline.auto_stop():
            for _ in range(3):
                loader = DataLoader(Tokens(24), batch_size=4, num_workers=2, worker_type="process")
                assert len(list(loader)) == 6
            release.set()  # before the pipeline stops: its threads can then end
    finally:
        release.set()
        stop.set()
        noisy.join()


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("ending", ["dropped", "break", "exception"])
def test_nothing_left_after_the_loader_is_done_with(
    ending: str, persistent: bool, nothing_left: None
) -> None:
    loader: Any = DataLoader(
        Tokens(64),
        batch_size=4,
        num_workers=2,
        worker_type="process",
        persistent_workers=persistent,
    )
    if ending == "dropped":
        list(loader)
    elif ending == "break":
        for i, _ in enumerate(loader):
            if i == 2:
                break
    else:
        with pytest.raises(ZeroDivisionError):
            for _ in loader:
                raise ZeroDivisionError("in the training loop")
    del loader


def test_an_epochs_own_workers_exit_once_its_last_batch_is_sent(nothing_left: None) -> None:
    # They exit while the loop still works on the last batches, not at the join that ends
    # the epoch; the epoch still ends, and the next one runs, as under torch.
    loader = DataLoader(MapData(16), batch_size=2, num_workers=2, worker_type="process")
    it = iter(loader)
    got = [next(it) for _ in range(len(loader))]  # every batch; no StopIteration yet
    for worker in it._workers:
        worker.join(WAIT)
        assert worker.exitcode == 0
    with pytest.raises(StopIteration):
        next(it)
    assert_same_batches(got, list(TorchDataLoader(MapData(16), batch_size=2)))
    assert_same_batches(list(loader), got)
    del it, loader


def test_persistent_workers_keep_their_processes_until_shutdown(nothing_left: None) -> None:
    from _dl_helpers import ProcessData

    loader = DataLoader(
        ProcessData(8, with_pid=True),
        batch_size=2,
        num_workers=2,
        worker_type="process",
        persistent_workers=True,
    )
    epochs = [{pid for b in loader for pid in b["pid"].tolist()} for _ in range(2)]
    assert epochs[0] == epochs[1] and len(epochs[0]) == 2 and os.getpid() not in epochs[0]
    assert all(psutil.pid_exists(pid) for pid in epochs[0])  # not told to exit at an end
    loader.shutdown()  # the fixture checks that they are gone


# -- batches the training loop keeps --------------------------------------------------------
@pytest.mark.parametrize("persistent", [False, True])
def test_a_kept_batch_stays_intact_while_later_batches_load(
    persistent: bool, nothing_left: None
) -> None:
    """Batches from worker processes view shared memory that later batches reuse: one the
    loop keeps (here: one in ten, and every batch of the first epoch) must never be
    written over, nor stop the loader, however many are kept."""
    loader: Any = DataLoader(
        SmallArrays(120),
        batch_size=3,
        num_workers=2,
        worker_type="process",
        persistent_workers=persistent,
    )
    ref = [b.clone() for b in TorchDataLoader(SmallArrays(120), batch_size=3)]
    kept = list(loader)  # every batch alive at once: more than the loader has arenas
    sparse = [b for i, b in enumerate(loader) if i % 10 == 0]
    again = list(loader)
    for got in (kept, again):
        assert_same_batches(got, ref)
    assert_same_batches(sparse, ref[::10])
    if persistent:
        loader.shutdown()
    del loader
    assert_same_batches(kept, ref)  # still valid once the workers are gone
    del kept, sparse, again


class PidStream(torch.utils.data.IterableDataset):
    """Each worker's share of ``range(n)``, each sample tagged with the reading process."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.n, step):
            yield torch.tensor([i, os.getpid()])


@pytest.mark.parametrize("persistent", [False, True])
def test_iterable_dataset_in_worker_processes(persistent: bool, nothing_left: None) -> None:
    """``worker_type="process"`` reads an ``IterableDataset`` in worker processes, as
    torch does; every batch may be kept (more than the loader has arenas)."""
    loader: Any = DataLoader(
        PidStream(90),
        batch_size=2,
        num_workers=2,
        worker_type="process",
        persistent_workers=persistent,
    )
    ref = [b[:, 0] for b in TorchDataLoader(PidStream(90), batch_size=2, num_workers=2)]
    for _ in range(2):
        kept = list(loader)
        assert_same_batches([b[:, 0] for b in kept], ref)
        pids = {int(p) for b in kept for p in b[:, 1]}
        assert len(pids) == 2 and os.getpid() not in pids
    if persistent:
        loader.shutdown()
    del loader, kept


class _HeldFirst(torch.utils.data.Dataset):
    """Ints; index 0 sets ``entered``, waits for ``release``, then ``finished``; every
    index loaded is appended to a file (process events and a file: the worker's side)."""

    def __init__(self, path: str, entered: Any, release: Any, finished: Any) -> None:
        self.path, self.entered, self.release, self.finished = path, entered, release, finished

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 0:
            self.entered.set()
            if not self.release.wait(WAIT):
                raise TimeoutError("the test never released the sample")
        with open(self.path, "a") as log:
            log.write(f"{i}\n")
        if i == 0:
            self.finished.set()
        return i


def test_workers_being_stopped_skip_the_batches_they_have_not_begun(tmp_path: Any) -> None:
    """Cancelled for good (the pool is about to stop its workers: an epoch's end, a
    break), a worker finishes the batch it is making and loads none of the others it was handed,
    as torch's workers skip theirs once their iterator shuts down: stopping never waits
    for batches nobody will read."""
    from torch.utils.data import default_collate

    from torch_spdl.data._workers.process_pool import ProcessWorkers

    fork = multiprocessing.get_context("fork")
    entered, release, finished = fork.Event(), fork.Event(), fork.Event()
    log = tmp_path / "loaded.txt"
    dataset = _HeldFirst(str(log), entered, release, finished)
    pool = ProcessWorkers(dataset, 1, 0, None, default_collate, True, in_flight=3, receiver=False)
    try:
        pool.start()
        for b in range(3):
            pool.submit(b, [b], None, [b])
        assert entered.wait(WAIT)  # making batch 0; batches 1 and 2 are in its pipe
        pool.cancel_pending(for_good=True)
        release.set()
        assert finished.wait(WAIT)
    finally:
        pool.shutdown()
    assert log.read_text().split() == ["0"]


def _arena_resident_bytes() -> int:
    """Resident bytes of this process's mappings of the loader's batch arenas."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if not line[0].isupper():  # a mapping's header line: address range first
                inside = "torch_spdl-batch" in line
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


class _Large(Dataset):
    """Samples of 3 MiB: a batch of 4 is 12 MiB, above what an arena keeps warm."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3, 512, 512), float(i))


def test_a_large_batchs_arena_gives_its_pages_back_as_torch_frees_its_batch() -> None:
    """torch's loader frees a batch's shared memory when the batch is freed; an arena that
    kept a large batch's pages warm held a batch more than torch (79 MiB of the training
    process's memory with batches of 256 images at 224x224)."""
    loader = DataLoader(_Large(), batch_size=4, num_workers=2, persistent_workers=True)
    try:
        sums = [float(batch.sum()) for batch in loader]  # every page read, as a step reads
        assert len(sums) == 4
        gc.collect()
        assert _arena_resident_bytes() < 4 * 3 * 512 * 512 * 4  # less than one batch
    finally:
        loader.shutdown()


# -- the worker's allocator ---------------------------------------------------------------------
_glibc = pytest.mark.skipif(
    not hasattr(os, "confstr") or "glibc" not in os.confstr("CS_GNU_LIBC_VERSION"),
    reason="glibc's allocator",
)
_LOADS_AT_ONCE = 8
_together = threading.Barrier(_LOADS_AT_ONCE)  # one per process: each worker has its own copy


def _allocator_heaps() -> int:
    """glibc's count of this process's malloc arenas (``malloc_info``'s ``<heap>`` entries)."""
    import ctypes
    import tempfile

    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return out.read().count("<heap nr=")


class _ThreadedLoads(StagedDataset):
    """A batch's loads all alive at once on their own threads, each allocating file-sized
    blocks; ``process`` reports how many arenas the worker's allocator then has."""

    def __len__(self) -> int:
        return 2 * _LOADS_AT_ONCE

    def load(self, index: int) -> int:
        _together.wait(WAIT)
        return len(bytearray(300_000 + index))

    def process(self, raw: int) -> dict[str, Any]:
        return {"heaps": _allocator_heaps(), "pid": os.getpid()}


@_glibc
@pytest.mark.parametrize("tuning", ["default", "off"])
def test_a_workers_load_threads_share_two_allocator_arenas(
    tuning: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each thread would take an arena of its own and keep its high-water mark resident
    (peak PSS above torch's on the latency store); the workers cap the arenas they make at
    two. ``TORCH_SPDL_MALLOC_TUNING=0`` leaves glibc's default, one arena a thread.

    Spawned workers: a forked one also inherits every arena its parent made (this suite's
    process has glibc's maximum by now) and its threads reuse those first."""
    if tuning == "off":
        monkeypatch.setenv("TORCH_SPDL_MALLOC_TUNING", "0")
    loader = DataLoader(
        _ThreadedLoads(),
        batch_size=_LOADS_AT_ONCE,
        num_workers=1,
        worker_type="process",
        io_concurrency=_LOADS_AT_ONCE,
        multiprocessing_context="spawn",
    )
    heaps = [h for b in loader for h in b["heaps"].tolist()]
    if tuning == "off":
        assert max(heaps) > _LOADS_AT_ONCE // 2, heaps  # what the cap prevents
    else:
        assert max(heaps) <= 2, heaps


_FRAGMENTED_BYTES = 96 << 20
_pinned: list[bytearray] = []  # blocks that outlive a batch, between the freed ones


class _FragmentingLoads(StagedDataset):
    """Batch 1's loads hold up to 96 MiB in blocks under glibc's mmap threshold, each
    followed by a block kept for good, and free the large ones; batches 0 and 2 load
    nothing. ``process`` reports the worker's resident bytes."""

    def __len__(self) -> int:
        return 12

    def load(self, index: int) -> int:
        if 4 <= index < 8:
            blocks = []
            for _ in range(_FRAGMENTED_BYTES // 4 // 100_000):
                blocks.append(bytes(100_000))
                _pinned.append(bytearray(1000))  # over pymalloc's 512 bytes: malloc's
            del blocks
        return index

    def process(self, index: int) -> int:
        return int(psutil.Process().memory_info().rss)


@_glibc
@pytest.mark.parametrize("tuning", ["default", "off"])
def test_a_staged_batchs_freed_loads_are_given_back(
    tuning: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes a staged batch's loads freed stay resident between the blocks that
    outlive them until the worker trims; it does after the batch.
    ``TORCH_SPDL_MALLOC_TUNING=0``: it does not."""
    if tuning == "off":
        monkeypatch.setenv("TORCH_SPDL_MALLOC_TUNING", "0")
    loader = DataLoader(  # spawned: a forked worker's first trim gives back pages the
        # suite's process freed before the fork, which would count as batch 0's
        _FragmentingLoads(),
        batch_size=4,
        num_workers=1,
        worker_type="process",
        io_concurrency=4,  # its loads on the worker's threads, whose arenas the trim is for
        multiprocessing_context="spawn",
    )
    before, during, after = (int(b.max()) for b in loader)
    grew = during - before
    assert grew > 16 << 20, (before, during, after)  # the loads' bytes, freed, resident
    if tuning == "off":
        assert after - before > grew // 2, (before, during, after)
    else:
        assert after - before < grew // 2, (before, during, after)
