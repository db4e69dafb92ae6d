"""torch's documented DataLoader behaviour, each case run against torch's loader and ours
and compared (issue 13), with every ``worker_type``.

Written from the documentation of ``torch.utils.data`` (worker information, iterable
datasets and their sharding, per-worker copies of the dataset, errors, ``timeout``,
``worker_init_fn``, ``persistent_workers``, ``in_order``), not from torch's tests.
"""

from __future__ import annotations

import functools
import gc
import os
import select
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _dl_helpers import MapData, ShardedByWorker, assert_same_batches
from _sync import WAIT
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset

from torch_spdl import DataLoader

WORKER_TYPES = ["auto", "thread", "process"]


@pytest.fixture(autouse=True)
def quiet_worker_count_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        yield


def both(dataset: Any, worker_type: str, **kwargs: Any) -> tuple[Any, Any]:
    """torch's loader and ours over the same arguments."""
    return TorchDataLoader(dataset, **kwargs), DataLoader(
        dataset, worker_type=worker_type, **kwargs
    )


# -- worker information --------------------------------------------------------------------
class InfoSamples(Dataset):
    """Each sample says what torch's ``get_worker_info()`` said where it was loaded."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return {"i": i, "id": -1, "num_workers": 0, "seed": 0}
        return {"i": i, "id": info.id, "num_workers": info.num_workers, "seed": info.seed}


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_get_worker_info_in_workers(worker_type: str, num_workers: int) -> None:
    """None in the main process; in a worker its id, the number of workers, and the seed
    ``base_seed + id``, the base seed drawn from the loader's generator.

    ``"auto"`` may run more threads than ``num_workers`` (work that waits) or replace its
    probing threads (when it switches), depending on what it measured: the ``n``-th thread
    it starts has the seed ``base_seed + n`` (no two threads share a stream) and the id ``n``
    modulo the workers it reports. That is what is asserted for it."""
    kwargs = {"batch_size": 4, "num_workers": num_workers, "generator": torch.Generator()}
    kwargs["generator"].manual_seed(7)
    ref_loader, ours_loader = both(InfoSamples(), worker_type, **kwargs)
    ref = list(ref_loader)
    ours_loader.generator.manual_seed(7)
    ours = list(ours_loader)
    assert torch.utils.data.get_worker_info() is None
    assert [b["i"].tolist() for b in ours] == [b["i"].tolist() for b in ref]
    seeds = {int(i): int(s) for b in ref for i, s in zip(b["id"], b["seed"], strict=True)}
    for b in ours:
        infos = zip(b["id"].tolist(), b["num_workers"].tolist(), b["seed"].tolist(), strict=True)
        for wid, workers, seed in infos:
            if worker_type == "auto" and num_workers > 0:
                assert 0 <= wid < workers and workers >= num_workers
                assert seed >= seeds[0] and (seed - seeds[0]) % workers == wid
            else:
                assert workers == num_workers
                assert seeds.get(wid, seed) == seed  # the worker's seed is torch's for that id
    if worker_type == "process" or num_workers == 0:
        assert_same_batches(ours, ref)  # torch's batch-to-worker assignment, too


# -- IterableDataset: sharding and order ----------------------------------------------------
class Uneven(IterableDataset):
    """Worker ``k`` yields ``3 + 4k`` samples: the round-robin order shows."""

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        k = 0 if info is None else info.id
        return iter(range(100 * k, 100 * k + 3 + 4 * k))


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
@pytest.mark.parametrize("num_workers", [1, 2, 4])
@pytest.mark.parametrize("batch", [None, 3, "3-drop"])
def test_iterable_dataset_sharding_and_order(worker_type: str, num_workers: int, batch) -> None:
    """Each worker iterates its own copy with its worker info, batches its own samples
    (``drop_last`` per worker), and batches come round-robin across workers."""
    kwargs: dict[str, Any] = {"num_workers": num_workers}
    kwargs["batch_size"] = 3 if batch else None
    kwargs["drop_last"] = batch == "3-drop"
    for dataset in (ShardedByWorker(23), Uneven()):
        ref, ours = both(dataset, worker_type, **kwargs)
        assert_same_batches(list(ours), list(ref))


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_iterable_dataset_out_of_order_gives_the_same_samples(worker_type: str) -> None:
    ref, ours = both(Uneven(), worker_type, num_workers=2, batch_size=2, in_order=False)
    flat = sorted(i for b in ours for i in b.tolist())
    assert flat == sorted(i for b in ref for i in b.tolist())


# -- each worker has its own copy of the dataset -----------------------------------------------
class PerWorkerState(Dataset):
    """``worker_init_fn`` opens a "connection" on the worker's dataset copy."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> str:
        info = torch.utils.data.get_worker_info()
        return f"{getattr(self, 'conn', None)}|{info.id}"


def open_connection(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    info.dataset.conn = f"conn-{worker_id}"


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_each_worker_has_its_own_dataset_copy(worker_type: str) -> None:
    dataset = PerWorkerState()
    for loader in both(
        dataset, worker_type, batch_size=2, num_workers=2, worker_init_fn=open_connection
    ):
        samples = [s for batch in loader for s in batch]
        assert len(samples) == 16
        for s in samples:
            conn, wid = s.split("|")
            assert conn == f"conn-{wid}", s  # the worker's own state, never another's
    assert not hasattr(dataset, "conn")  # the loader's process's dataset is untouched


def test_sharing_one_dataset_is_an_opt_in() -> None:
    dataset = PerWorkerState()
    list(
        DataLoader(
            dataset,
            batch_size=2,
            num_workers=2,
            worker_type="thread",
            worker_init_fn=open_connection,
            per_worker_dataset=False,
        )
    )
    assert dataset.conn in ("conn-0", "conn-1")  # the one object, set by the last worker


# -- errors ----------------------------------------------------------------------------------
class FailsAt(Dataset):
    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise KeyError(f"bad sample {i}")
        return i


def catch_per_batch(loader: Any) -> list[Any]:
    """A loop that catches per-batch errors and goes on, as torch allows: the batches,
    and the type of each error in its place. (The messages differ on purpose: torch
    rewrites a worker's error message; we keep it and add notes.)"""
    seen: list[Any] = []
    it = iter(loader)
    while True:
        try:
            seen.append(next(it).tolist())
        except StopIteration:
            return seen
        except KeyError as exc:
            seen.append(type(exc).__name__)


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_mid_epoch_does_not_end_it(worker_type: str, num_workers: int) -> None:
    ref, ours = both(FailsAt({5, 13}), worker_type, batch_size=4, num_workers=num_workers)
    assert catch_per_batch(ours) == catch_per_batch(ref)


def failing_init(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_worker_init_fn_error_is_raised_as_itself(worker_type: str) -> None:
    ref, ours = both(
        MapData(8), worker_type, batch_size=2, num_workers=2, worker_init_fn=failing_init
    )
    loaders = [ref, ours] if worker_type == "process" else [ours]  # torch's once: 10 s
    for loader in loaders:
        with pytest.raises(ValueError, match="cannot start"):
            list(loader)
        # torch's failed iterator is left in a reference cycle with its error, and its
        # __del__ joins torch's workers (5 s each). Collected here, not by whichever thread
        # of our loader triggers the next collection: that thread would be held up 10 s
        # (and the leak check found it still running).
        gc.collect()


_PIPES: list[tuple[int, int]] = []  # closed once the module's tests are done (see below)


@pytest.fixture(scope="module", autouse=True)
def _close_pipes() -> Iterator[None]:
    """The pipes of ``Stalls`` outlive its test: a loader leaves a stuck worker to finish on
    its own, and datasets are copied per worker (same descriptors), so no copy may close
    them. By the module's end every worker is gone (each test checks that it left none)."""
    yield
    while _PIPES:
        for fd in _PIPES.pop():
            os.close(fd)


class Stalls(Dataset):
    """Sample 4 waits until the test lets it go (a read that hangs).

    The wait is on a pipe, which a forked worker process shares and which holds no lock
    (a worker killed in the middle of it breaks nothing); its bound only keeps a broken
    loader from hanging the suite."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        _PIPES.append((self._read, self._write))

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if i == 4:
            select.select([self._read], [], [], WAIT)
        return i

    def release(self) -> None:
        os.write(self._write, b"!")  # readable from now on, for every waiter


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_timeout_raises_while_a_worker_is_stuck(worker_type: str) -> None:
    """``timeout``: a batch not received within it raises RuntimeError; the stuck worker
    does not hold the error back (it is left to finish, then ends)."""
    for make in (TorchDataLoader, functools.partial(DataLoader, worker_type=worker_type)):
        dataset, error = Stalls(), ""
        batches = iter(make(dataset, batch_size=2, num_workers=2, timeout=0.5))
        try:
            list(batches)
        except RuntimeError as exc:
            error = str(exc)
        finally:
            dataset.release()  # the stuck read ends, so that the stop below is prompt
            del batches  # (torch's iterator stops its worker processes when dropped)
        assert "timed out" in error, error


# -- typing, persistence, order ----------------------------------------------------------------
def test_generic_subscripting() -> None:
    def annotated() -> DataLoader[list[torch.Tensor]]:
        return DataLoader(MapData(4))

    assert TorchDataLoader[int] is not None and DataLoader[int] is not None
    assert isinstance(annotated(), TorchDataLoader)


class InitCount:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, worker_id: int) -> None:
        self.calls.append(worker_id)


@pytest.mark.parametrize("worker_type", ["auto", "thread"])  # a process's calls stay there
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_runs_once_per_worker_and_epoch_unless_persistent(
    worker_type: str, persistent: bool
) -> None:
    """torch runs it in every worker at start; a worker *thread* runs it before its first
    sample (a thread that gets none runs it never: docs/torch-differences.md)."""
    count = InitCount()
    loader = DataLoader(
        MapData(8),
        batch_size=2,
        num_workers=2,
        worker_type=worker_type,
        worker_init_fn=count,
        persistent_workers=persistent,
    )
    per_epoch = []
    for _ in range(3):
        before = len(count.calls)
        list(loader)
        per_epoch.append(count.calls[before:])
    for calls in per_epoch:  # at most once per worker, ids among torch's
        assert len(calls) == len(set(calls)) and set(calls) <= {0, 1}
    assert per_epoch[0]  # some worker ran it
    if persistent:
        assert len(count.calls) == len(set(count.calls))  # never twice for a worker
    loader.shutdown()


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_out_of_order_gives_the_same_batches(worker_type: str) -> None:
    ref, ours = both(MapData(30, "int"), worker_type, batch_size=4, num_workers=2, in_order=False)
    assert sorted(b.tolist() for b in ours) == sorted(b.tolist() for b in ref)


# -- an IterableDataset that yields more than len(loader) said (issue 31) ------------------
class UnshardedWithLength(IterableDataset):
    """Every worker yields the whole range: with 2 workers, twice ``len()``."""

    def __len__(self) -> int:
        return 4

    def __iter__(self):
        return iter(range(4))


def _warned_at(loader: Any) -> list[int]:
    """Which batches (1-based) warned that more than ``len(loader)`` were fetched."""
    assert len(loader) == 4  # asked before the epoch: the epoch compares against it
    warned = []
    iterator = iter(loader)
    for n in range(1, 9):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            next(iterator)
        if any("samples have been fetched" in str(w.message) for w in caught):
            warned.append(n)
    return warned


@pytest.mark.parametrize("worker_type", WORKER_TYPES)
def test_yielding_more_than_the_reported_length_warns_past_it(worker_type: str) -> None:
    theirs, ours = both(UnshardedWithLength(), worker_type, batch_size=None, num_workers=2)
    assert _warned_at(ours) == _warned_at(theirs) == [5, 6, 7, 8]


@pytest.mark.parametrize("persistent", [False, True])
def test_pin_memory_without_an_accelerator_warns_as_torchs_loader(persistent: bool) -> None:
    """A script that passes ``pin_memory=True`` (torchvision's references do) on a machine
    without an accelerator gets torch's warning, as often as torch gives it."""
    if torch.accelerator.is_available():
        pytest.skip("the warning is for machines without an accelerator")

    def told(cls: Any) -> list[str]:
        loader = cls(
            list(range(8)), batch_size=4, pin_memory=True, num_workers=1,
            persistent_workers=persistent,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                list(loader)
        return [str(w.message) for w in caught if "pin_memory" in str(w.message)]

    torchs = told(TorchDataLoader)
    assert torchs and told(DataLoader) == torchs
