"""The failure paths tried hard (issue 29): what a failed pipeline leaves behind, a stuck op
at a timeout or a break, a loader alive at interpreter exit, and ``worker_init_fn`` under
``worker_type="auto"``.

Nothing here is timed: reachability is checked with weak references and the cycle collector
switched off, leftovers by counting descriptors and threads, and delays by whether a thread
was waited for at all (an op that never returns until the test lets it go).
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest
import torch
from _sync import CHILD_S, CHILD_START_S, WAIT
from torch.utils.data import Dataset

from torch_spdl import DataLoader, get_worker_info
from torch_spdl.pipeline import PipelineBuilder, PipelineFailure, defs

pytestmark = pytest.mark.timeout(CHILD_S)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _big_then_boom(x: int) -> bytearray:
    if x == 3:
        raise ValueError(f"bad item {x}")
    return bytearray(10 << 20)


@pytest.mark.parametrize("region", [False, True], ids=["threads", "process-region"])
def test_failed_pipelines_are_freed_without_the_cycle_collector(region: bool) -> None:
    """20 pipelines whose stage fails (10 MiB items): each is freed as soon as the caller
    drops it (no cycle through its failure, its traceback, its frames), and the descriptors
    it opened are closed (after a collection for a process region, whose process objects
    are part of its stages' graph)."""
    gc.collect()  # first: garbage an earlier test left may still hold descriptors
    before = _fds()
    refs = []
    gc.disable()
    try:
        for _ in range(20):
            builder = PipelineBuilder().add_source(range(8))
            if region:
                builder = (
                    builder.to(defs.ProcessPoolExecutorConfig(max_workers=1))
                    .pipe(_big_then_boom)
                    .to(defs.MAIN_PROCESS)
                )
            else:
                builder = builder.pipe(_big_then_boom, concurrency=2)
            pipeline = builder.add_sink(2).build(num_threads=2, max_failures=0)
            refs.append(weakref.ref(pipeline))
            with pytest.raises(PipelineFailure):
                with pipeline.auto_stop():
                    # a region's first item waits for its worker interpreter to start
                    for _ in pipeline.get_iterator(timeout=CHILD_START_S if region else WAIT):
                        pass
            del pipeline, builder
        assert [r for r in refs if r() is not None] == []
        if not region:
            assert _fds() == before
    finally:
        gc.enable()
    gc.collect()
    assert _fds() == before


class _Counted:
    """A source and an op a test watches with weak references."""

    def __iter__(self):
        return iter(range(8))

    def __call__(self, x: int) -> int:
        return x


def test_a_finished_pipeline_frees_its_declaration_without_the_cycle_collector() -> None:
    """Once a pipeline is dropped, what it was declared with (its source, its ops and what
    they hold) goes with it, not into a cycle left for the collector: a DataLoader's worker
    processes hang off such parts."""
    gc.disable()
    try:
        source, op = _Counted(), _Counted()
        refs = [weakref.ref(source), weakref.ref(op)]
        pipeline = PipelineBuilder().add_source(source).pipe(op, concurrency=2).add_sink(2).build()
        with pipeline.auto_stop():
            assert sorted(pipeline) == list(range(8))
        del pipeline, source, op
        assert [r for r in refs if r() is not None] == []
    finally:
        gc.enable()


def test_persistent_workers_stop_once_the_loader_and_its_iterator_are_dropped() -> None:
    """torch's ``test_partial_workers`` with persistent workers: the loop breaks, the script
    drops its iterator and its loader, and their worker processes exit, with no help from
    the cycle collector (torch's loader stops them when it is freed)."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children()}
    gc.disable()
    try:
        data = torch.utils.data.TensorDataset(torch.arange(64))
        loader = DataLoader(data, batch_size=2, num_workers=2, persistent_workers=True)
        it = iter(loader)
        for i, _ in enumerate(it):
            if i == 3:
                break
        workers = [p for p in me.children() if p.pid not in before]
        assert len(workers) == 2
        del it, loader, _
        _, alive = psutil.wait_procs(workers, timeout=WAIT)
        assert alive == []
    finally:
        gc.enable()


class _Made:
    """An item a test can watch with a weak reference."""


def test_what_stop_keeps_for_get_item_goes_with_the_pipeline() -> None:
    """A pipeline started explicitly keeps what its sink held at ``stop()`` for
    ``get_item()``; dropped, it frees those items at once, without the cycle collector,
    though its failed run's stages are left for the collector (an out-of-order loader
    whose worker died kept its last batch, and that batch's arena, until a collection)."""
    made: list[weakref.ref] = []
    failed = threading.Event()

    def make(x: int) -> _Made:
        if x == 3:  # one worker: items 0-2 are in the sink (or staged for it) by now
            failed.set()
            raise ValueError(f"bad item {x}")
        item = _Made()
        made.append(weakref.ref(item))
        return item

    pipeline = (
        PipelineBuilder()
        .add_source(range(8))
        .pipe(make)
        .add_sink(8)
        .build(num_threads=1, max_failures=0)
    )
    gc.collect()
    gc.disable()
    try:
        pipeline.start()
        assert failed.wait(WAIT)
        with pytest.raises(PipelineFailure):
            pipeline.stop()
        assert len([r for r in made if r() is not None]) == 3  # kept for get_item()
        del pipeline
        assert [r for r in made if r() is not None] == []
    finally:
        gc.enable()


def test_a_stuck_op_does_not_hold_up_a_timeout_or_a_break(caplog: pytest.LogCaptureFixture) -> None:
    """An op that never returns (until the test lets it go): the iterator's timeout raises,
    and stopping does not wait for the op; its thread is left, a daemon, named in a
    warning, and ends when the op returns."""
    release = threading.Event()
    entered = threading.Event()

    def stuck(x: int) -> int:
        if x == 2:
            entered.set()
            release.wait()
        return x

    caplog.set_level(logging.WARNING, logger="torch_spdl.pipeline")
    pipeline = PipelineBuilder().add_source(range(100)).pipe(stuck).add_sink(2).build()
    try:
        with pytest.raises(TimeoutError):
            with pipeline.auto_stop():
                assert entered.wait(WAIT)  # the op is stuck; what came before it is ready
                for _ in pipeline.get_iterator(timeout=0.5):
                    pass
        # stop() returned while the op still runs: nobody waited for it
        left = [t for t in threading.enumerate() if "stuck" in t.name]
        assert left and all(t.daemon for t in left), [t.name for t in threading.enumerate()]
        assert any(t.name in r.getMessage() for t in left for r in caplog.records)
    finally:
        release.set()
    for t in left:
        t.join(WAIT)
        assert not t.is_alive()


def test_a_thread_loader_alive_at_exit_leaves_no_waiting_thread(tmp_path: os.PathLike) -> None:
    """A thread-mode loader whose iterator is still alive when the interpreter exits: its
    source thread, which waits for room for the next batch, is released as the pipeline
    stops, and no thread is reported stuck."""
    script = textwrap.dedent(
        """
        import torch
        from torch_spdl import DataLoader

        class Ints(torch.utils.data.Dataset):
            def __len__(self):
                return 10_000
            def __getitem__(self, i):
                return i

        # the source soon waits for room: the batches in flight are all made
        it = iter(DataLoader(Ints(), batch_size=4, num_workers=2, worker_type="thread"))
        next(it)
        print("exiting", flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=CHILD_S
    )
    assert out.returncode == 0, out.stderr
    assert "exiting" in out.stdout
    assert "did not stop" not in out.stderr, out.stderr


class _Waits(Dataset):
    """I/O-shaped samples (the GIL released while waiting), recording the worker id each
    sample sees."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        threading.Event().wait(0.002)
        info = get_worker_info()
        assert info is not None and 0 <= info.id < info.num_workers
        return i


def test_auto_with_worker_init_fn_runs_num_workers_threads() -> None:
    """``worker_init_fn`` sets up one worker each: with ``"auto"`` on waiting work it is
    called with ids below ``num_workers`` only, and the worker ids seen by
    ``get_worker_info()`` stay below ``num_workers`` too."""
    called: list[int] = []
    lock = threading.Lock()

    def init(wid: int) -> None:
        with lock:
            called.append(wid)

    loader = DataLoader(
        _Waits(256), batch_size=8, num_workers=2, worker_type="auto", worker_init_fn=init
    )
    for _ in range(2):
        assert torch.cat(list(loader)).tolist() == list(range(256))
    assert set(called) <= {0, 1}, called


class _ExitsAt(Dataset):
    """Sample ``at`` ends its worker process (``os._exit``), as a crash in C would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            os._exit(3)
        return torch.full((1024,), i)


def _settled(before: set[threading.Thread]) -> None:
    """Wait for the threads the loaders started (those not in ``before``) to end. A stopping
    epoch waits a bounded time for its threads (so that a stuck one never delays the loop)
    and lets a slow one finish its teardown behind; on a loaded machine that teardown can
    still be running when the loop goes on, so what is left behind is counted once they
    are done."""
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith("torch_spdl"):
            thread.join()


def _arena_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum("torch_spdl-batch" in line for line in maps)


@pytest.mark.parametrize("options", [{}, {"in_order": False}], ids=["default", "out-of-order"])
def test_failed_loaders_leave_no_descriptor_or_mapping(options: dict) -> None:
    """Six loaders whose worker dies, read with explicit ``next()`` and dropped after the
    ``WorkerFailure`` (its traceback kept by the test): no loader stays reachable, and the
    descriptors and arena mappings are back where they started, without the cycle
    collector."""
    from torch_spdl.data import WorkerFailure

    gc.collect()  # first: garbage an earlier test left may still hold descriptors
    fds, maps = _fds(), _arena_maps()
    threads = set(threading.enumerate())
    refs, errors = [], []
    gc.disable()
    try:
        for _ in range(6):
            loader = DataLoader(_ExitsAt(20), batch_size=4, num_workers=2, **options)
            refs.append(weakref.ref(loader))
            it = iter(loader)
            with pytest.raises(WorkerFailure) as caught:
                while True:
                    next(it)
            errors.append(caught.value)
            del it, loader, caught
        _settled(threads)
        assert [r for r in refs if r() is not None] == []
        assert (_fds(), _arena_maps()) == (fds, maps)
    finally:
        gc.enable()
