"""``torch_spdl.DataLoader`` when things fail: sample, collate and sampler errors reach the
caller with notes, ``max_failures``, timeouts, and every way of stopping early leaves no
thread behind.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import warnings
from typing import Any

import pytest
import torch
from _dl_helpers import (
    MapData,
    assert_no_pipeline_threads,
    assert_same_batches,
    ids,
    list_collate,
)
from _sync import WAIT
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import (
    Dataset,
)

from torch_spdl import DataLoader, StagedDataset


# -- 4. errors ---------------------------------------------------------------------------------
class SampleError(Exception):
    pass


class BadAt(Dataset):
    """Int samples; raises ``SampleError`` on the ``bad`` indices."""

    def __init__(self, n: int, bad: set[int], reached: threading.Event | None = None) -> None:
        self.n = n
        self.bad = bad
        self.reached = reached

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            if self.reached is not None:
                self.reached.set()
            raise SampleError(f"cannot read {i}")
        return i


@pytest.mark.parametrize("num_workers", [0, 4])
def test_getitem_error_reaches_caller_with_notes(num_workers: int) -> None:
    loader = DataLoader(BadAt(20, {13}), batch_size=4, num_workers=num_workers)
    got = []
    with pytest.raises(SampleError, match="cannot read 13") as exc:
        for batch in loader:
            got.append(batch.tolist())
    notes = " ".join(getattr(exc.value, "__notes__", []))
    assert "13" in notes and "getitem" in notes, notes
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]][: len(got)]  # a prefix


def test_batches_before_a_failure_are_delivered_first() -> None:
    failed = threading.Event()

    class SlowHead(BadAt):
        def __getitem__(self, i: int) -> int:
            if i == 0:  # batch 0 completes only after sample 5 has failed
                failed.wait(WAIT)
            return super().__getitem__(i)

    loader = DataLoader(SlowHead(12, {5}, failed), batch_size=2, num_workers=4)
    got = []
    with pytest.raises(SampleError):
        for batch in loader:
            got.append(batch.tolist())
    assert got == [[0, 1], [2, 3]]  # what torch delivers before raising


def test_staged_dataset_error_names_the_stage() -> None:
    class BadLoad(StagedDataset):
        def __len__(self) -> int:
            return 8

        def load(self, i: int) -> int:
            if i == 6:
                raise SampleError("no file 6")
            return i

    with pytest.raises(SampleError) as exc:
        list(DataLoader(BadLoad(), batch_size=2, num_workers=2))
    notes = " ".join(getattr(exc.value, "__notes__", []))
    assert "6" in notes and "load" in notes, notes


@pytest.mark.parametrize("num_workers", [0, 4])
def test_collate_error_reaches_caller_with_notes(num_workers: int) -> None:
    def collate(samples: list[int]) -> list[int]:
        if 9 in samples:
            raise SampleError("cannot collate")
        return samples

    loader = DataLoader(
        MapData(20, "int"), batch_size=4, num_workers=num_workers, collate_fn=collate
    )
    with pytest.raises(SampleError, match="cannot collate") as exc:
        list(loader)
    notes = " ".join(getattr(exc.value, "__notes__", []))
    assert "collate" in notes and "batch 2" in notes, notes


@pytest.mark.parametrize("num_workers", [0, 4])
def test_max_failures_skips_bad_samples(num_workers: int) -> None:
    bad = {5, 14}
    loader = DataLoader(BadAt(20, bad), batch_size=4, num_workers=num_workers, max_failures=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ids(list(loader))
    want = [[i for i in range(b, b + 4) if i not in bad] for b in range(0, 20, 4)]
    assert got == want
    assert loader.num_failures == 2


def test_max_failures_exceeded_raises() -> None:
    loader = DataLoader(BadAt(20, {2, 5, 14}), batch_size=4, num_workers=2, max_failures=2)
    with pytest.raises(SampleError):
        list(loader)


@pytest.mark.parametrize("batch_size", [1, None])
def test_max_failures_skips_a_batch_whose_samples_all_failed(batch_size: int | None) -> None:
    loader = DataLoader(BadAt(6, {2}), batch_size=batch_size, num_workers=2, max_failures=1)
    got = [torch.as_tensor(b).reshape(-1).tolist() for b in loader]
    assert got == [[0], [1], [3], [4], [5]]
    assert loader.num_failures == 1


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("num_workers", [0, 4])
def test_breaking_out_leaves_no_thread(num_workers: int, persistent: bool) -> None:
    if persistent and num_workers == 0:
        pytest.skip("persistent_workers needs workers")
    # many samples and a small buffer: the workers are blocked on a full buffer at the break
    loader = DataLoader(
        MapData(400, "int"),
        batch_size=2,
        num_workers=num_workers,
        buffer_size=1,
        persistent_workers=persistent,
    )
    for batch in loader:
        assert batch.tolist() == [0, 1]
        break
    if persistent:
        loader.shutdown()
    assert_no_pipeline_threads()


def test_exception_in_loop_body_leaves_no_thread() -> None:
    loader = DataLoader(MapData(400, "int"), batch_size=2, num_workers=4, buffer_size=1)
    with pytest.raises(RuntimeError, match="user code"):
        for _ in loader:
            raise RuntimeError("user code")
    assert_no_pipeline_threads()


def test_dropping_a_started_iterator_leaves_no_thread() -> None:
    loader = DataLoader(MapData(400, "int"), batch_size=2, num_workers=4, buffer_size=1)
    it = iter(loader)
    next(it)
    del it
    assert_no_pipeline_threads()


class BreakingSampler:
    def __iter__(self):
        yield from (0, 1, 2)
        raise SampleError("sampler broke")

    def __len__(self) -> int:
        return 4


@pytest.mark.parametrize("num_workers", [0, 3])
def test_sampler_error_reaches_caller_after_earlier_batches(num_workers: int) -> None:
    ds = MapData(4, "int")
    got, ref = [], []
    with pytest.raises(SampleError, match="sampler broke"):
        for batch in TorchDataLoader(ds, sampler=BreakingSampler()):
            ref.append(batch.tolist())
    with pytest.raises(SampleError, match="sampler broke"):
        for batch in DataLoader(ds, sampler=BreakingSampler(), num_workers=num_workers):
            got.append(batch.tolist())
    assert got == ref == [[0], [1], [2]]


def test_empty_batch_from_batch_sampler_matches_torch() -> None:
    ds = MapData(4, "int")
    batches = [[0, 1], [], [2], [3]]
    ref = list(TorchDataLoader(ds, batch_sampler=batches, collate_fn=list_collate))
    ours = list(DataLoader(ds, batch_sampler=batches, collate_fn=list_collate, num_workers=2))
    assert_same_batches(ours, ref)


def test_timeout_is_honoured() -> None:
    release = threading.Event()

    class Stuck(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> int:
            release.wait(WAIT)  # bounded only so that a loader ignoring timeout still ends
            return i

    loader = DataLoader(Stuck(), num_workers=2, timeout=0.2)
    error = None
    try:
        list(loader)
    except RuntimeError as exc:
        error = exc
    finally:
        release.set()
    assert error is not None and "timed out" in str(error)


class LockAt(Dataset):
    """Int samples, and a ``threading.Lock`` (which cannot pickle) at index ``bad``."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> object:
        return threading.Lock() if i == self.bad else i


def _as_list(samples: list[object]) -> list[object]:
    return samples


def test_unpicklable_batch_names_cause_and_samples_and_the_epoch_goes_on() -> None:
    """A batch a worker process cannot send back is an error naming why and which samples,
    raised in the loop; the worker lives and the next batches come."""
    loader = DataLoader(LockAt(8, 5), batch_size=2, num_workers=2, collate_fn=_as_list)
    it = iter(loader)
    assert [next(it), next(it)] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="pickle") as exc:
        next(it)
    notes = " ".join(exc.value.__notes__)
    assert "[4, 5]" in notes and "batch 2" in notes, notes
    assert list(it) == [[6, 7]]


class _LogsLoads(Dataset):
    """Ints; each index loaded is appended to a file, from whichever process loads it.
    Index ``hold`` first sets ``entered`` and waits for ``release`` (process events)."""

    def __init__(self, n: int, path: str, hold: int, entered: Any, release: Any) -> None:
        self.n, self.path, self.hold = n, path, hold
        self.entered, self.release = entered, release

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.hold:
            self.entered.set()
            if not self.release.wait(WAIT):
                raise TimeoutError("the test never released the sample")
        with open(self.path, "a") as log:
            log.write(f"{i}\n")
        return i


@pytest.mark.parametrize("impl", ["torch", "torch_spdl"])
def test_a_break_with_persistent_workers_loads_what_torchs_loads(impl: str, tmp_path: Any) -> None:
    """A break while a persistent worker makes a batch: it makes that batch and those it
    was handed after it before the next epoch's, as torch's does (the worker's random
    draws, and its dataset's state, are then torch's in the next epoch)."""
    fork = multiprocessing.get_context("fork")
    entered, release = fork.Event(), fork.Event()
    log = tmp_path / "loaded.txt"
    dataset = _LogsLoads(8, str(log), hold=1, entered=entered, release=release)
    loader_class = TorchDataLoader if impl == "torch" else DataLoader
    loader = loader_class(
        dataset, batch_size=1, num_workers=1, prefetch_factor=2, persistent_workers=True
    )
    try:
        it = iter(loader)
        assert next(it).tolist() == [0]  # batches 1 and 2 are the worker's by now
        assert entered.wait(WAIT)  # it is making batch 1
        del it  # the break
        release.set()
        assert [b.item() for b in loader] == list(range(8))
        assert [int(line) for line in log.read_text().split()] == [0, 1, 2, *range(8)]
    finally:
        if impl == "torch_spdl":
            loader.shutdown()


def _running_frames() -> set[int]:
    """Frames some live thread is executing (a thread another test left running is not a
    frame this test's epochs kept)."""
    running = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
    return running


@pytest.mark.parametrize(
    "options",
    [{}, {"in_order": False}, {"worker_type": "thread"}],
    ids=["default", "out-of-order", "thread"],
)
def test_early_breaks_free_their_epoch_without_the_cycle_collector(options: dict) -> None:
    """Persistent workers, a break after 3 batches, many times, with the cycle collector
    off: every epoch starts (none waits for batches of an abandoned one that only a
    ``gc.collect()`` would free), and no frame of the loader's threads outlives its epoch
    (an exception shared by the stage threads once kept them all, batches included)."""
    import gc

    loader = DataLoader(
        MapData(3200, "int"),
        batch_size=32,
        num_workers=2,
        persistent_workers=True,
        timeout=120,  # a stall fails the test instead of hanging it
        **options,
    )
    gc.collect()
    gc.disable()
    try:
        for _ in range(30):
            got = 0
            for got, _batch in enumerate(loader, 1):
                if got == 3:
                    break
            assert got == 3
        del _batch
        kept = [
            f
            for f in gc.get_objects()
            if type(f).__name__ == "frame"
            and "torch_spdl" in f.f_code.co_filename
            and id(f) not in _running_frames()
        ]
        assert kept == []
    finally:
        gc.enable()
        loader.shutdown()
