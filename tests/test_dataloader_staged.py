"""``torch_spdl.DataLoader`` with ``StagedDataset``s: results like torch's, the declared I/O
and CPU concurrency respected, and recycled batch buffers never overwritten while held.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _dl_helpers import (
    assert_same_batches,
    gen,
    ids,
)
from _sync import WAIT
from torch.utils.data import BatchSampler, Dataset, SequentialSampler
from torch.utils.data import DataLoader as TorchDataLoader

from torch_spdl import DataLoader, Stage, StagedDataset
from torch_spdl.streaming.testing import Faults, LocalHTTP


# -- 6. staged datasets ------------------------------------------------------------------------
class SyncStaged(StagedDataset):
    def __len__(self) -> int:
        return 17

    def load(self, i: int) -> dict[str, Any]:
        return {"raw": i, "bytes": bytes([i])}

    def process(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {"x": torch.tensor([raw["raw"], raw["bytes"][0] * 2]), "i": raw["raw"]}


class AsyncStaged(SyncStaged):
    async def load(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        await asyncio.sleep(0)  # yields to the event loop (not used to wait for anything)
        return {"raw": i, "bytes": bytes([i])}


class ThreeStep(StagedDataset):
    def __len__(self) -> int:
        return 17

    def read(self, i: int) -> tuple[int, str]:
        return i, f"file{i}"

    def decode(self, raw: tuple[int, str]) -> torch.Tensor:
        return torch.full((2,), float(raw[0]))

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3 + 1

    def stages(self):
        return [
            Stage(self.read, "io", name="read"),
            Stage(self.decode, "cpu", name="decode"),
            Stage(self.augment, "cpu", concurrency=2, name="augment"),
        ]


@pytest.mark.parametrize("num_workers", [0, 3])
@pytest.mark.parametrize("cls", [SyncStaged, AsyncStaged, ThreeStep])
def test_staged_dataset_matches_torch(cls: type[Dataset], num_workers: int) -> None:
    ds = cls()
    ref = list(TorchDataLoader(ds, batch_size=4, shuffle=True, generator=gen(6)))
    ours = list(
        DataLoader(ds, batch_size=4, shuffle=True, generator=gen(6), num_workers=num_workers)
    )
    assert_same_batches(ours, ref)


class ConcurrencyProbe:
    """Counts concurrent calls; the first ``bound`` callers wait for each other, so the
    count provably reaches the bound (and would pass it, were more calls allowed in)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(bound, timeout=WAIT)
        self.current = 0
        self.max = 0
        self.arrivals = 0

    def __enter__(self) -> None:
        with self.lock:
            self.current += 1
            self.max = max(self.max, self.current)
            first_wave = self.arrivals < self.bound
            self.arrivals += 1
        if first_wave:
            self.barrier.wait()

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.current -= 1


def test_io_and_cpu_concurrency_are_respected() -> None:
    io, cpu = ConcurrencyProbe(3), ConcurrencyProbe(2)

    class Probed(StagedDataset):
        def __len__(self) -> int:
            return 30

        def load(self, i: int) -> int:
            with io:
                return i

        def process(self, i: int) -> int:
            with cpu:
                return i

    # num_workers=6 would give 8 loads and 6 processes at once by default (on threads: the
    # counters are this process's)
    loader = DataLoader(
        Probed(),
        batch_size=4,
        num_workers=6,
        io_concurrency=3,
        cpu_concurrency=2,
        worker_type="thread",
    )
    assert [i for b in ids(list(loader)) for i in b] == list(range(30))
    assert io.max == 3
    assert cpu.max == 2


class AsyncProbed(StagedDataset):
    """An async ``load`` that records, in the process it runs in, how many loads run at
    once; the first ``bound`` wait for each other, so the count provably reaches it."""

    bound = 4
    state: dict[str, Any] = {"current": 0, "max": 0, "arrivals": 0}

    def __len__(self) -> int:
        return 32

    async def load(self, i: int) -> tuple[int, int]:
        state = self.state
        ev = state.setdefault("ev", asyncio.Event())
        state["current"] += 1
        state["max"] = max(state["max"], state["current"])
        state["arrivals"] += 1
        if state["arrivals"] == self.bound:
            ev.set()
        if state["arrivals"] <= self.bound:
            await asyncio.wait_for(ev.wait(), WAIT)
        state["current"] -= 1
        return i, state["max"]


def test_async_load_concurrency_is_respected_in_each_worker() -> None:
    # batches of 8, at most 4 loads at once in each worker process (their own counters)
    loader = DataLoader(AsyncProbed(), batch_size=8, num_workers=2, io_concurrency=4)
    samples = [s for b in loader for s in zip(*(t.tolist() for t in b), strict=True)]
    assert sorted(i for i, _ in samples) == list(range(32))
    assert max(most for _, most in samples) == AsyncProbed.bound


class Placed(StagedDataset):
    """Reports where each stage ran: its process and thread."""

    def __len__(self) -> int:
        return 24

    def load(self, i: int) -> tuple[int, int, str]:
        return i, os.getpid(), threading.current_thread().name

    def process(self, raw: tuple[int, int, str]) -> tuple[int, int, str, int, str, float]:
        where = (os.getpid(), threading.current_thread().name, torch.rand(1).item())
        return (*raw, *where)


@pytest.mark.parametrize("io_concurrency", [None, 4])
def test_with_worker_processes_every_stage_runs_in_the_workers(io_concurrency: int | None) -> None:
    """The training process runs no user code: ``load`` in the workers, ``process`` on
    their main threads, in order (its random draws are torch's). ``load`` starts on each
    worker's main thread, one sample after another, until its loads are seen to wait;
    with an ``io_concurrency`` the user said they wait, and it starts on the worker's io
    threads (timed there: the first three batches of each worker)."""
    loader = DataLoader(
        Placed(), batch_size=4, num_workers=2, generator=gen(2), io_concurrency=io_concurrency
    )
    rows = [r for b in loader for r in zip(*b, strict=True)]
    ref = list(TorchDataLoader(Placed(), batch_size=4, num_workers=2, generator=gen(2)))
    assert [r[-1] for r in rows] == [r[-1] for b in ref for r in zip(*b, strict=True)]
    load_pids, process_pids = {int(r[1]) for r in rows}, {int(r[3]) for r in rows}
    assert os.getpid() not in load_pids and load_pids == process_pids and len(load_pids) == 2
    assert all(r[4] == "MainThread" for r in rows)
    if io_concurrency is None:  # each worker's first two batches (then: as they are judged)
        assert all(r[2] == "MainThread" for r in rows[: 2 * 2 * 4])
    else:
        assert all(r[2].startswith("torch_spdl-io") for r in rows)


class Computing(Placed):
    """Loads that compute (about a millisecond of hashing each) and never wait."""

    def __len__(self) -> int:
        return 32

    def load(self, i: int) -> tuple[int, int, str]:
        digest = str(i).encode()
        for _ in range(2000):
            digest = hashlib.sha256(digest).digest()
        return i, os.getpid(), threading.current_thread().name


def test_loads_that_compute_run_inline_from_the_first_batch() -> None:
    """Loads that never wait (hashing, as a decode inside ``load``) run on the worker's
    main thread from its first batch: on threads they only took turns under the GIL, at
    more CPU. Workers that are not persistent are new every epoch: each starts as the
    worker of its id ended the epoch before (inline here; a loaded machine may judge
    otherwise), instead of judging afresh."""
    loader = DataLoader(Computing(), batch_size=2, num_workers=2)
    epochs = [[r for b in loader for r in zip(*b, strict=True)] for _ in range(2)]
    first, second = ([r[2] == "MainThread" for r in rows] for rows in epochs)
    assert all(first[: 2 * 2 * 2])  # each worker's first two batches, before any judgement
    # worker w's batches are w, w + 2, ...
    for w in (0, 1):
        last = [inline for k, inline in enumerate(first) if (k // 2) % 2 == w][-2:]
        start = [inline for k, inline in enumerate(second) if (k // 2) % 2 == w][:2]
        assert start == last, (w, first, second)
    assert {r[1] for r in epochs[0]}.isdisjoint({r[1] for r in epochs[1]})  # new processes


_READ_LATENCY = 0.02  # seconds the store waits before each answer (a remote round trip)


@pytest.fixture(scope="module")
def store() -> Iterator[LocalHTTP]:
    """An HTTP store on 127.0.0.1 that answers each read after :data:`_READ_LATENCY`."""
    with LocalHTTP({f"s{i}": bytes([i]) * 64 for i in range(48)}, Faults(_READ_LATENCY)) as s:
        yield s


class Fetched(StagedDataset):
    """Loads that wait: each reads its sample from an HTTP store; where it ran."""

    def __init__(self, store: LocalHTTP) -> None:
        self.urls = [store.url(f"s{i}") for i in range(48)]

    def __len__(self) -> int:
        return len(self.urls)

    def load(self, i: int) -> tuple[int, int, str]:
        with urllib.request.urlopen(self.urls[i], timeout=WAIT) as answer:
            assert answer.read() == bytes([i]) * 64
        return i, os.getpid(), threading.current_thread().name

    def process(self, raw: tuple[int, int, str]) -> tuple[int, int, str]:
        return raw


def test_loads_that_wait_move_to_the_threads_and_the_next_epoch_starts_there(
    store: LocalHTTP,
) -> None:
    """A worker's first two batches read one sample after another on its main thread;
    they block and sleep on the store, so from its third batch a batch's reads run at once
    on its io threads, and the next epoch's worker of its id starts there."""
    loader = DataLoader(Fetched(store), batch_size=6, num_workers=2)
    epochs = [[r for b in loader for r in zip(*b, strict=True)] for _ in range(2)]
    for rows in epochs:
        assert [int(r[0]) for r in rows] == list(range(48))
    first, second = ([r[2] == "MainThread" for r in rows] for rows in epochs)
    assert all(first[: 2 * 2 * 6]) and not any(first[2 * 2 * 6 :]), first
    assert not any(second), second


@pytest.mark.parametrize("batching", ["batch_size", "batch_sampler"])
def test_the_reads_of_a_batch_overlap_in_its_worker(batching: str, store: LocalHTTP) -> None:
    """Once they are seen to wait, every read of a batch runs at once: the store answers
    more reads at once than there are workers. Also when the batches come from a
    ``batch_sampler`` (torchvision's detection reference passes one): the loader's
    ``batch_size`` is then None, and the batch's reads once ran one after another."""
    if batching == "batch_size":
        loader = DataLoader(Fetched(store), batch_size=6, num_workers=2)
    else:
        batches = BatchSampler(SequentialSampler(range(48)), 6, drop_last=False)
        loader = DataLoader(Fetched(store), batch_sampler=batches, num_workers=2)
    store.faults.max_in_flight = 0
    assert [int(i) for b in loader for i in b[0].tolist()] == list(range(48))
    assert store.faults.max_in_flight > 2, store.faults.max_in_flight


def test_a_staged_epoch_in_worker_processes_starts_no_thread_in_the_training_process() -> None:
    """Its stages all run in the workers, so the training process only sends indices and
    reads batches, inside ``next()``, as for a plain dataset and as torch does: no receiver
    thread and no pipeline threads beside the training step (only the task sender)."""
    before = {t.ident for t in threading.enumerate()}
    loader = DataLoader(Placed(), batch_size=4, num_workers=2)
    seen: set[str] = set()
    for _ in loader:
        seen |= {t.name for t in threading.enumerate() if t.ident not in before}
    assert seen <= {"torch_spdl-worker-sender"}, seen


class FailingLoad(SyncStaged):
    def load(self, i: int) -> dict[str, Any]:
        if i == 5:
            raise OSError(f"cannot read sample {i}")
        return super().load(i)


def test_a_failing_load_in_a_worker_names_the_stage_and_the_index() -> None:
    with pytest.raises(OSError, match="cannot read sample 5") as info:
        list(DataLoader(FailingLoad(), batch_size=4, num_workers=2))
    assert any("stage 'load' failed on sample index 5" in n for n in info.value.__notes__)


class _LargeSamples(Dataset):
    """3x512x512 uint8 samples (768 KiB): a batch of 4 is large enough to be recycled."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3, 512, 512), i % 256, dtype=torch.uint8)


@pytest.mark.parametrize(("workers", "worker_type"), [(0, "thread"), (2, "thread"), (2, "process")])
def test_recycled_batch_buffers_never_overwrite_a_batch_still_held(
    workers: int, worker_type: str
) -> None:
    """Large batches are stacked (or copied out of a worker's arena) into reused buffers:
    every batch kept by the consumer must keep its values while later batches are made, and
    buffers must be reused once dropped."""
    ref = list(TorchDataLoader(_LargeSamples(), batch_size=4))
    loader = DataLoader(_LargeSamples(), batch_size=4, num_workers=workers, worker_type=worker_type)
    held = list(loader)  # every batch alive at once: no buffer may be handed out twice
    assert_same_batches(held, ref)
    del held
    seen, kept = set(), None
    for i, batch in enumerate(loader):  # one batch kept across all the later ones
        seen.add(batch.data_ptr())
        if i == 1:
            kept = batch
    assert kept is not None and torch.equal(kept, ref[1])
    # dropped buffers came back (24 batches; a process loader has more batches in flight)
    assert len(seen) < (len(ref) // 2 if worker_type == "thread" else len(ref))


def test_a_worker_runs_loads_that_do_not_wait_inline() -> None:
    """The rules a worker applies to its loads: inline, they move to the threads where
    they blocked and slept (a read from a network file system); timed on the threads, they
    come back where they computed."""
    from torch_spdl.data._loading.staged_batch import (
        ThreadClocks,
        computes,
        inline_wins,
        slept,
        thread_clocks,
        verdict,
    )

    assert computes([(0.010, 0.009), (0.012, 0.010)])  # a decode in load, a cached file
    assert not computes([(0.005, 0.0002), (0.006, 0.0003)])  # 5 ms waits on storage
    assert not computes([])
    # two batches of 8: each on its own thread, ...
    cached = [(0.010, 0.009)] * 16
    assert verdict(cached, [(0.080, 8)] * 2) == "inline"
    # ... 8 small decodes under the GIL, each waiting for the others: a trial inline
    turns = [(0.0021, 0.0006)] * 16
    assert verdict(turns, [(0.0045, 8)] * 2) == "try"
    # ... 10 ms reads that overlap: threads, no trial
    reads = [(0.0104, 0.0004)] * 16
    assert verdict(reads, [(0.013, 8)] * 2) == "threads"
    assert verdict([], []) == "threads"
    # the trial: inline when it took no longer a sample than the threaded batches
    assert inline_wins([(0.0045, 8)] * 2, (0.0040, 8))
    assert not inline_wins([(0.030, 8)] * 2, (0.085, 8))  # 5 ms waits before 5 ms decodes
    assert not inline_wins([], (0.001, 1))
    # inline: a batch of loads that blocked and slept (neither ran nor waited for a core)
    # a third of its wall time waited on something; one that was busy did not
    assert slept(ThreadClocks(0.0, 0.0, 0), ThreadClocks(0.002, 0.001, 3), 0.005)
    assert not slept(ThreadClocks(0.0, 0.0, 0), ThreadClocks(0.004, 0.0005, 1), 0.005)
    # no queue clock: counted as 0
    assert slept(ThreadClocks(0.0, None, 0), ThreadClocks(0.001, None, 2), 0.005)
    # never blocked: it ran or waited for a core, whatever its queue clock's lumps say
    # (a 3 ms batch beside a training step once gained 28 ms of queue time, the one
    # before none in 27 ms)
    assert not slept(ThreadClocks(0.0, 0.0, 5), ThreadClocks(0.002, 0.0, 5), 0.027)
    # no switch count: no opinion
    assert not slept(ThreadClocks(0.0, 0.0, 0), ThreadClocks(0.002, 0.0, None), 0.027)
    # the clocks of this thread move as it runs and blocks
    before = thread_clocks()
    threading.Event().wait(0.01)  # a block, not synchronisation
    after = thread_clocks()
    assert after.cpu >= before.cpu
    if after.blocks is not None:
        assert after.blocks > before.blocks
