"""``torch_spdl.DataLoader`` against ``torch.utils.data.DataLoader``.

Every comparison runs torch's own loader with ``num_workers=0`` as the reference and ours
with threads; batches must match exactly, in order. Synchronisation in these tests is
done with barriers, events and conditions (with timeouts so a bug fails rather than
hangs), never with sleeps.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import multiprocessing
import os
import threading
import warnings
from typing import Any

import pytest
import torch
from _dl_helpers import (
    IterData,
    MapData,
    ProcessBadData,
    ProcessData,
    ProcessWorkerInfoData,
    assert_same_batches,
    list_collate,
    make_sample,
    mark_init,
    single_collate,
)
from _sync import WAIT
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
)
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data.distributed import DistributedSampler

from torch_spdl import DataLoader, Stage, StagedDataset, get_worker_info

N = 23  # samples in the matrix datasets (odd, so drop_last matters)


# -- helpers --------------------------------------------------------------------------------
def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("torch_spdl")]


def assert_no_pipeline_threads() -> None:
    for t in pipeline_threads():
        t.join(timeout=WAIT)
    assert not [t.name for t in pipeline_threads()]


def ids(batches: list[torch.Tensor]) -> list[list[int]]:
    """Batches of int samples (collated to 1-d tensors) as lists of indices."""
    return [b.tolist() for b in batches]


# -- 1. the matrix against torch ---------------------------------------------------------------
class VarBatchSampler:
    """A batch sampler with variable batch sizes (1, 2, 3, 4, 1, 2, ...) over a permutation."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed

    def _batches(self) -> list[list[int]]:
        order = torch.randperm(self.n, generator=gen(self.seed)).tolist()
        out, size = [], 1
        while order:
            out.append(order[:size])
            order = order[size:]
            size = size % 4 + 1
        return out

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


MAP_CONFIGS = {
    "default": lambda ds: {},
    "bs4": lambda ds: {"batch_size": 4},
    "bs4_drop_last": lambda ds: {"batch_size": 4, "drop_last": True},
    "shuffle": lambda ds: {"batch_size": 3, "shuffle": True, "generator": gen(7)},
    "shuffle_drop_last": lambda ds: {
        "batch_size": 5,
        "shuffle": True,
        "drop_last": True,
        "generator": gen(8),
    },
    "subset_sampler": lambda ds: {
        "batch_size": 3,
        "sampler": SubsetRandomSampler(list(range(1, len(ds), 2)), generator=gen(3)),
    },
    "list_sampler_repeats": lambda ds: {"batch_size": 2, "sampler": [5, 3, 3, 0, 22, 5, 1]},
    "weighted_sampler": lambda ds: {
        "batch_size": 4,
        "sampler": WeightedRandomSampler(
            [float(i % 3 + 1) for i in range(len(ds))], 30, replacement=True, generator=gen(5)
        ),
    },
    "var_batch_sampler": lambda ds: {"batch_sampler": VarBatchSampler(len(ds), seed=11)},
    "batch_sampler": lambda ds: {
        "batch_sampler": BatchSampler(RandomSampler(ds, generator=gen(2)), 4, drop_last=True)
    },
    "batch_none": lambda ds: {"batch_size": None},
    "batch_none_shuffle": lambda ds: {"batch_size": None, "shuffle": True, "generator": gen(9)},
    "collate_fn": lambda ds: {"batch_size": 4, "collate_fn": list_collate},
    "collate_fn_lambda": lambda ds: {"batch_size": 3, "collate_fn": lambda b: ("n", len(b), b)},
    "collate_fn_none": lambda ds: {"batch_size": None, "collate_fn": single_collate},
    "prefetch_persistent": lambda ds: {
        "batch_size": 4,
        "shuffle": True,
        "generator": gen(4),
        "prefetch_factor": 3,
        "persistent_workers": True,
    },
}

ITER_CONFIGS = {
    "default": lambda ds: {},
    "bs4": lambda ds: {"batch_size": 4},
    "bs4_drop_last": lambda ds: {"batch_size": 4, "drop_last": True},
    "batch_none": lambda ds: {"batch_size": None},
    "collate_fn": lambda ds: {"batch_size": 3, "collate_fn": list_collate},
    "collate_fn_none": lambda ds: {"batch_size": None, "collate_fn": single_collate},
}

KINDS = ["tensor", "dict", "tuple", "int"]
NEEDS_WORKERS = {"prefetch_persistent"}  # torch rejects these knobs with num_workers=0


def run_both(ds: Dataset, config, num_workers: int, **ours_kwargs: Any):
    """(our batches, torch's batches, our len, torch's len) for one configuration: torch's
    single-process loader for a map-style dataset (same batches, and fast); for an
    iterable one, torch's worker processes (each worker reads its own copy)."""
    ref_kwargs = config(ds)
    workers = num_workers if isinstance(ds, IterableDataset) else 0
    if not workers:
        ref_kwargs.pop("prefetch_factor", None)
        ref_kwargs.pop("persistent_workers", None)
    ref = TorchDataLoader(ds, num_workers=workers, **ref_kwargs)
    ours = DataLoader(ds, num_workers=num_workers, **config(ds), **ours_kwargs)
    return list(ours), list(ref), len(ours), len(ref)


@pytest.mark.parametrize("num_workers", [0, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", list(MAP_CONFIGS))
def test_map_style_matches_torch(config: str, kind: str, num_workers: int) -> None:
    if config in NEEDS_WORKERS and num_workers == 0:
        pytest.skip("torch rejects prefetch_factor/persistent_workers with num_workers=0")
    ds = MapData(N, kind)
    ours, ref, n_ours, n_ref = run_both(ds, MAP_CONFIGS[config], num_workers)
    assert_same_batches(ours, ref)
    assert n_ours == n_ref == len(ref)


@pytest.mark.parametrize("num_workers", [0, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", list(ITER_CONFIGS))
def test_iterable_matches_torch(config: str, kind: str, num_workers: int) -> None:
    ds = IterData(N, kind)
    ours, ref, n_ours, n_ref = run_both(ds, ITER_CONFIGS[config], num_workers)
    assert_same_batches(ours, ref)
    assert n_ours == n_ref  # len(dataset) batches, as torch says (each worker reads it all)


def test_iterable_without_len_matches_torch() -> None:
    class NoLen(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    ours = DataLoader(NoLen(), batch_size=3, num_workers=2)
    ref = TorchDataLoader(NoLen(), batch_size=3, num_workers=2)
    assert_same_batches(list(ours), list(ref))
    with pytest.raises(TypeError):
        len(ref)
    with pytest.raises(TypeError):
        len(ours)


def test_iterable_sharding_by_worker_info_reads_everything_once() -> None:
    """An IterableDataset that shards itself by torch's worker info (the usual recipe)
    reads every sample once, in torch's order, whatever the number of workers."""
    from _dl_helpers import ShardedByWorker

    for workers in (0, 1, 3):
        ref = list(TorchDataLoader(ShardedByWorker(12), batch_size=4, num_workers=workers))
        ours = list(DataLoader(ShardedByWorker(12), batch_size=4, num_workers=workers))
        assert_same_batches(ours, ref)
        assert sorted(i for b in ours for i in b.tolist()) == list(range(12))


@pytest.mark.parametrize("num_workers", [0, 4])
def test_out_of_order_gives_the_same_samples(num_workers: int) -> None:
    ds = MapData(40, "int")
    ref = TorchDataLoader(ds, batch_size=3, shuffle=True, generator=gen(1))
    ours = DataLoader(
        ds, batch_size=3, shuffle=True, generator=gen(1), num_workers=num_workers, in_order=False
    )
    got = ids(list(ours))
    want = ids(list(ref))
    assert sorted(map(sorted, got)) == sorted(map(sorted, want))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device": "cpu"},
        {"pin_memory": True},
        {"collate_concurrency": 3},
        {"buffer_size": 1},
        {"io_concurrency": 2, "cpu_concurrency": 3},
    ],
    ids=lambda kw: ",".join(kw),
)
def test_extra_knobs_keep_torch_output(kwargs: dict[str, Any]) -> None:
    ds = MapData(N, "dict")
    config = MAP_CONFIGS["shuffle"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about pin_memory without a GPU
        ours, ref, _, _ = run_both(ds, config, 3, **kwargs)
    assert_same_batches(ours, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pin_memory", [False, True])
def test_device_moves_batches_to_cuda(pin_memory: bool) -> None:
    ds = MapData(N, "dict")
    ref = list(TorchDataLoader(ds, batch_size=4))
    ours = list(DataLoader(ds, batch_size=4, num_workers=2, device="cuda", pin_memory=pin_memory))
    assert ours[0]["x"].device.type == "cuda"
    moved_back = [
        {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in ours
    ]
    assert_same_batches(moved_back, ref)


# -- 2. constructor ----------------------------------------------------------------------------
class _SeqIter(IterableDataset):
    def __iter__(self):
        return iter(range(5))


BAD_ARGS = {
    "num_workers_negative": lambda ds: (ds, {"num_workers": -1}),
    "prefetch_without_workers": lambda ds: (ds, {"prefetch_factor": 2}),
    "persistent_without_workers": lambda ds: (ds, {"persistent_workers": True}),
    "sampler_and_shuffle": lambda ds: (ds, {"sampler": SequentialSampler(ds), "shuffle": True}),
    "batch_sampler_and_batch_size": lambda ds: (
        ds,
        {"batch_sampler": BatchSampler(SequentialSampler(ds), 2, False), "batch_size": 4},
    ),
    "batch_sampler_and_shuffle": lambda ds: (
        ds,
        {"batch_sampler": BatchSampler(SequentialSampler(ds), 2, False), "shuffle": True},
    ),
    "batch_sampler_and_drop_last": lambda ds: (
        ds,
        {"batch_sampler": BatchSampler(SequentialSampler(ds), 2, False), "drop_last": True},
    ),
    "batch_none_drop_last": lambda ds: (ds, {"batch_size": None, "drop_last": True}),
    "timeout_negative": lambda ds: (ds, {"timeout": -1}),
    "prefetch_negative": lambda ds: (ds, {"num_workers": 2, "prefetch_factor": -1}),
    "iterable_shuffle": lambda ds: (_SeqIter(), {"shuffle": True}),
    "iterable_sampler": lambda ds: (_SeqIter(), {"sampler": [0, 1]}),
    "iterable_batch_sampler": lambda ds: (_SeqIter(), {"batch_sampler": [[0, 1]]}),
    "bad_mp_context": lambda ds: (ds, {"num_workers": 2, "multiprocessing_context": "nope"}),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_constructor_raises_what_torch_raises(case: str) -> None:
    ds = MapData(10)
    dataset, kwargs = BAD_ARGS[case](ds)
    with pytest.raises(Exception) as ref:
        TorchDataLoader(dataset, **kwargs)
    with pytest.raises(type(ref.value)) as ours:
        DataLoader(dataset, **kwargs)
    assert type(ours.value) is type(ref.value)
    assert str(ours.value) == str(ref.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"worker_type": "fiber"},
        {"io_concurrency": 0},
        {"cpu_concurrency": -1},
        {"collate_concurrency": 0},
        {"buffer_size": 0},
        {"max_failures": -1},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_constructor_validates_own_knobs(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DataLoader(MapData(4), **kwargs)


def test_is_a_torch_dataloader_holding_the_users_objects() -> None:
    ds = MapData(10)
    sampler = RandomSampler(ds, generator=gen(0))
    g = gen(1)
    loader = DataLoader(ds, batch_size=3, sampler=sampler, collate_fn=list_collate, generator=g)
    assert isinstance(loader, TorchDataLoader)
    assert loader.dataset is ds
    assert loader.sampler is sampler
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.sampler is sampler
    assert loader.collate_fn is list_collate
    assert loader.generator is g
    assert loader.batch_size == 3

    batch_sampler = VarBatchSampler(10, seed=0)
    loader = DataLoader(ds, batch_sampler=batch_sampler, num_workers=2)
    assert loader.batch_sampler is batch_sampler
    assert loader.batch_size is None
    assert loader.dataset is ds


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_constructing_starts_nothing(worker_type: str) -> None:
    ds = ProcessData(10)
    threads = threading.active_count()
    children = len(multiprocessing.active_children())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "too many worker processes" on 2 cores
        loaders = [
            DataLoader(ds, batch_size=2, num_workers=4, worker_type=worker_type),
            DataLoader(
                ds, batch_size=2, num_workers=4, persistent_workers=True, worker_type=worker_type
            ),
        ]
    assert threading.active_count() == threads
    assert len(multiprocessing.active_children()) == children
    assert not pipeline_threads()
    del loaders


def test_many_thread_workers_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DataLoader(MapData(4), num_workers=(os.cpu_count() or 1) * 8)


@pytest.mark.parametrize("shuffle", [False, True])
def test_reinstantiation_with_distributed_sampler(shuffle: bool) -> None:
    """What Lightning does: ``type(loader)(dataset, sampler=DistributedSampler(...), ...)``."""
    ds = MapData(N, "int")
    loader = DataLoader(ds, batch_size=4, num_workers=2)
    new = type(loader)(
        ds,
        sampler=DistributedSampler(ds, num_replicas=2, rank=0, shuffle=shuffle, seed=3),
        batch_size=4,
        num_workers=2,
    )
    ref = TorchDataLoader(
        ds, sampler=DistributedSampler(ds, num_replicas=2, rank=0, shuffle=shuffle, seed=3),
        batch_size=4,
    )  # fmt: skip
    got = ids(list(new))
    assert got == ids(list(ref))
    flat = [i for b in got for i in b]
    assert len(flat) == (N + 1) // 2  # rank 0's share of an even split
    if not shuffle:
        assert flat == list(range(0, N, 2))


def test_lightning_update_dataloader_keeps_our_knobs() -> None:
    data = pytest.importorskip("lightning.fabric.utilities.data")
    ds = MapData(N, "int")
    loader = DataLoader(ds, batch_size=4, num_workers=2, io_concurrency=3, max_failures=2)
    new = data._update_dataloader(loader, DistributedSampler(ds, num_replicas=2, rank=1))
    assert type(new) is DataLoader
    assert (new.io_concurrency, new.max_failures, new.num_workers) == (3, 2, 2)
    ref = TorchDataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, 2, 1))
    assert ids(list(new)) == ids(list(ref))


# -- 3. epochs, workers, worker info -----------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 3])
def test_each_iter_is_a_new_epoch_like_torch(num_workers: int) -> None:
    ds = MapData(N, "int")
    ours = DataLoader(ds, batch_size=4, shuffle=True, generator=gen(5), num_workers=num_workers)
    ref = TorchDataLoader(ds, batch_size=4, shuffle=True, generator=gen(5))
    epochs = []
    for _ in range(3):
        got = ids(list(ours))
        assert got == ids(list(ref))
        epochs.append(got)
    assert epochs[0] != epochs[1] != epochs[2]


def test_distributed_sampler_set_epoch_changes_order_like_torch() -> None:
    ds = MapData(N, "int")
    ours_sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=4)
    ref_sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=4)
    ours = DataLoader(ds, batch_size=3, sampler=ours_sampler, num_workers=2)
    ref = TorchDataLoader(ds, batch_size=3, sampler=ref_sampler)
    seen = []
    for epoch in range(3):
        ours_sampler.set_epoch(epoch)
        ref_sampler.set_epoch(epoch)
        got = ids(list(ours))
        assert got == ids(list(ref))
        seen.append(got)
    assert seen[0] != seen[1] != seen[2]


class InitTracker:
    """A worker_init_fn and a dataset that record which thread was which worker."""

    def __init__(self, num_workers: int) -> None:
        self.lock = threading.Lock()
        self.init_calls: list[tuple[int, int]] = []  # (worker id, thread ident)
        self.seen: dict[int, set[int]] = collections.defaultdict(set)  # thread -> worker ids
        self.barrier = threading.Barrier(num_workers, timeout=WAIT)
        self.arrivals = 0
        self.num_workers = num_workers

    def init(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None and info.id == worker_id
        with self.lock:
            self.init_calls.append((worker_id, threading.get_ident()))

    def dataset(self, n: int) -> Dataset:
        tracker = self

        class Tracked(Dataset):
            def __len__(self) -> int:
                return n

            def __getitem__(self, i: int) -> int:
                info = get_worker_info()
                with tracker.lock:
                    tracker.seen[threading.get_ident()].add(info.id)
                    first_wave = tracker.arrivals < tracker.num_workers
                    tracker.arrivals += 1
                if first_wave:  # every worker takes a sample: all of them start
                    tracker.barrier.wait()
                return i

        return Tracked()


@pytest.mark.parametrize("persistent", [True, False])
def test_worker_init_fn_runs_once_per_worker(persistent: bool) -> None:
    workers, epochs = 2, 3
    tracker = InitTracker(workers)
    loader = DataLoader(
        tracker.dataset(10),
        batch_size=2,
        num_workers=workers,
        worker_init_fn=tracker.init,
        persistent_workers=persistent,
    )
    per_epoch = []
    for _ in range(epochs):
        tracker.arrivals = 0  # the first samples of each epoch meet at the barrier
        assert ids(list(loader)) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
        per_epoch.append(list(tracker.init_calls))
    calls = tracker.init_calls
    if persistent:
        assert len(calls) == workers, calls
        assert per_epoch[0] == per_epoch[-1]  # no init after the first epoch
        assert sorted(wid for wid, _ in calls) == list(range(workers))
        threads = {ident for _, ident in calls}
        assert set(tracker.seen) == threads  # the same threads served every epoch
        for wid, ident in calls:
            assert tracker.seen[ident] == {wid}  # ... each keeping its worker id
        loader.shutdown()
    else:
        assert len(calls) == workers * epochs, calls
        for e in range(epochs):
            new = per_epoch[e][len(per_epoch[e - 1]) if e else 0 :]
            assert sorted(wid for wid, _ in new) == list(range(workers))


def test_persistent_workers_are_stopped_with_the_loader() -> None:
    loader = DataLoader(MapData(8), batch_size=2, num_workers=2, persistent_workers=True)
    list(loader)
    list(loader)
    del loader
    gc.collect()
    assert_no_pipeline_threads()


@pytest.mark.parametrize("num_workers", [2, 4])
def test_get_worker_info(num_workers: int) -> None:
    infos: list[Any] = []
    lock = threading.Lock()

    class Info(Dataset):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> int:
            info = get_worker_info()
            with lock:
                infos.append(info)
            return i

    ds = Info()
    base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen(3)).item())
    loader = DataLoader(ds, batch_size=4, num_workers=num_workers, generator=gen(3))
    assert get_worker_info() is None
    for _ in loader:
        assert get_worker_info() is None  # the loop body is not a worker
    assert get_worker_info() is None
    assert len(infos) == 16
    for info in infos:
        assert info is not None
        assert info.id in range(num_workers)
        assert info.num_workers == num_workers
        assert type(info.dataset) is Info and info.dataset is not ds  # the worker's copy
        assert info.seed == base_seed + info.id  # torch's seed for worker `id`
        assert info.generator.initial_seed() == info.seed
    # each worker has its own generators (not the global ones)
    by_id = {info.id: info for info in infos}
    assert len({id(info.generator) for info in by_id.values()}) == len(by_id)


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
            release.wait(1.0)  # bounded, so that a loader ignoring timeout still ends
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


# -- 5. resume ---------------------------------------------------------------------------------
class Counting(Dataset):
    """Int samples; counts ``__getitem__`` calls per index (and in all, with a condition).

    The counters are objects changed in place, so the workers' copies of the dataset
    (shallow, as documented) all count into them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: collections.Counter[int] = collections.Counter()
        self.cond = threading.Condition()

    @property
    def total(self) -> int:
        return self.calls.total()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.cond:
            self.calls[i] += 1
            self.cond.notify_all()
        return i

    def wait_for_total(self, total: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.total >= total, timeout=WAIT)


def assert_reads_only(ds: Counting, batches: list[list[int]]) -> None:
    """``ds`` read exactly the samples of ``batches``, each once."""
    wanted = collections.Counter(i for b in batches for i in b)
    assert ds.calls == wanted, f"read {dict(ds.calls)}, delivered {dict(wanted)}"


def resume_loader(ds: Dataset, num_workers: int, **kwargs: Any) -> DataLoader:
    return DataLoader(
        ds, batch_size=3, shuffle=True, generator=gen(21), num_workers=num_workers, **kwargs
    )


@pytest.mark.parametrize("k", [0, 1, 4, 13])
@pytest.mark.parametrize("num_workers", [0, 4])
def test_resume_delivers_exactly_the_rest(num_workers: int, k: int) -> None:
    n = 40  # 14 batches of 3 (the last of 1)
    full = ids(list(resume_loader(MapData(n, "int"), num_workers)))
    assert len(full) == 14

    first = resume_loader(MapData(n, "int"), num_workers)
    it = iter(first)
    taken = [next(it).tolist() for _ in range(k)]
    state = first.state_dict()
    del it

    ds = Counting(n)
    second = resume_loader(ds, num_workers)
    second.load_state_dict(state)
    rest = ids(list(second))
    assert taken + rest == full
    assert_reads_only(ds, rest)
    # and the loader goes on with the next epoch afterwards
    assert sorted(i for b in ids(list(second)) for i in b) == list(range(n))


@pytest.mark.parametrize("num_workers", [0, 4])
def test_resume_in_a_later_epoch_then_continue(num_workers: int) -> None:
    n = 20
    ref = resume_loader(MapData(n, "int"), num_workers)
    epochs = [ids(list(ref)) for _ in range(3)]

    first = resume_loader(MapData(n, "int"), num_workers)
    assert ids(list(first)) == epochs[0]
    it = iter(first)
    taken = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    del it

    second = resume_loader(MapData(n, "int"), num_workers)
    second.load_state_dict(state)
    assert taken + ids(list(second)) == epochs[1]
    assert ids(list(second)) == epochs[2]


def test_resume_with_the_global_rng() -> None:
    """``shuffle=True`` without a generator draws from torch's global RNG."""
    n = 20

    def make(ds: Dataset) -> DataLoader:
        return DataLoader(ds, batch_size=3, shuffle=True, num_workers=2)

    torch.manual_seed(123)
    full = ids(list(make(MapData(n, "int"))))
    torch.manual_seed(123)
    first = make(MapData(n, "int"))
    it = iter(first)
    taken = [next(it).tolist() for _ in range(3)]
    state = first.state_dict()
    del it
    torch.manual_seed(999)  # a new process: another global state
    ds = Counting(n)
    second = make(ds)
    second.load_state_dict(state)
    rest = ids(list(second))
    assert taken + rest == full
    assert_reads_only(ds, rest)


def test_state_dict_before_iterating_resumes_a_whole_epoch() -> None:
    state = resume_loader(MapData(10, "int"), 2).state_dict()
    loader = resume_loader(MapData(10, "int"), 2)
    loader.load_state_dict(state)
    assert ids(list(loader)) == ids(list(resume_loader(MapData(10, "int"), 2)))


def test_resume_with_later_batches_in_flight() -> None:
    """The state is taken while the buffer is full of batches not yet delivered."""
    n, bs, buffer, k = 60, 2, 3, 2
    full = ids(list(DataLoader(MapData(n, "int"), batch_size=bs, shuffle=True, generator=gen(8))))

    ds = Counting(n)
    first = DataLoader(
        ds, batch_size=bs, shuffle=True, generator=gen(8), num_workers=4, buffer_size=buffer
    )
    it = iter(first)
    taken = [next(it).tolist() for _ in range(k)]
    # wait until the batches after the taken ones are read (the buffer fills up)
    assert ds.wait_for_total((k + buffer) * bs)
    state = first.state_dict()
    del it

    ds2 = Counting(n)
    second = DataLoader(
        ds2, batch_size=bs, shuffle=True, generator=gen(8), num_workers=4, buffer_size=buffer
    )
    second.load_state_dict(state)
    rest = ids(list(second))
    assert taken + rest == full
    assert_reads_only(ds2, rest)


def test_resume_out_of_order() -> None:
    """``in_order=False``: later batches overtake a slow one; the state must keep track."""
    n, bs = 24, 2
    gate = threading.Event()

    class Gated(Counting):
        def __getitem__(self, i: int) -> int:
            if i == 0:  # batch 0 cannot complete until the gate opens
                assert gate.wait(WAIT)
            return super().__getitem__(i)

    first = DataLoader(Gated(n), batch_size=bs, num_workers=4, in_order=False)
    it = iter(first)
    taken = [next(it).tolist() for _ in range(3)]
    assert all(0 not in b for b in taken)  # they overtook batch 0
    state = first.state_dict()
    gate.set()
    del it

    ds = Counting(n)
    second = DataLoader(ds, batch_size=bs, num_workers=4, in_order=False)
    second.load_state_dict(state)
    rest = ids(list(second))
    assert sorted(i for b in taken + rest for i in b) == list(range(n))
    assert sorted(map(sorted, taken + rest)) == [[i, i + 1] for i in range(0, n, 2)]
    assert_reads_only(ds, rest)


@pytest.mark.parametrize("k", [1, 5])
def test_resume_out_of_order_shuffled(k: int) -> None:
    n = 30
    full = ids(list(resume_loader(MapData(n, "int"), 0)))
    first = resume_loader(MapData(n, "int"), 4, in_order=False)
    it = iter(first)
    taken = [next(it).tolist() for _ in range(k)]
    state = first.state_dict()
    del it
    ds = Counting(n)
    second = resume_loader(ds, 4, in_order=False)
    second.load_state_dict(state)
    rest = ids(list(second))
    assert sorted(map(sorted, taken + rest)) == sorted(map(sorted, full))
    assert_reads_only(ds, rest)


def test_resume_twice_within_an_epoch() -> None:
    """Two preemptions in one epoch: the second state must count the first one's batches."""
    n = 40
    full = ids(list(resume_loader(MapData(n, "int"), 4)))
    taken: list[list[int]] = []
    state = None
    for run in range(2):
        loader = resume_loader(MapData(n, "int"), 4)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        taken += [next(it).tolist() for _ in range(3 + run)]
        state = loader.state_dict()
        del it
    ds = Counting(n)
    last = resume_loader(ds, 4)
    last.load_state_dict(state)
    rest = ids(list(last))
    assert taken + rest == full
    assert_reads_only(ds, rest)


def test_resume_with_distributed_sampler() -> None:
    """Lightning's flow: a new loader, ``set_epoch`` on its sampler, then the state."""
    ds = MapData(N, "int")

    def make(data: Dataset, epoch: int) -> DataLoader:
        sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=9)
        sampler.set_epoch(epoch)
        return DataLoader(data, batch_size=2, sampler=sampler, num_workers=3)

    full = ids(list(make(ds, 1)))
    first = make(ds, 1)
    it = iter(first)
    taken = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    del it
    counting = Counting(N)
    second = make(counting, 1)
    second.load_state_dict(state)
    rest = ids(list(second))
    assert taken + rest == full
    assert_reads_only(counting, rest)


def test_resume_from_the_end_of_an_epoch_starts_the_next_epoch() -> None:
    n = 12
    ref = resume_loader(MapData(n, "int"), 2)
    epochs = [ids(list(ref)) for _ in range(2)]
    first = resume_loader(MapData(n, "int"), 2)
    it = iter(first)
    assert ids(list(it)) == epochs[0]
    state = first.state_dict()
    del it
    second = resume_loader(MapData(n, "int"), 2)
    second.load_state_dict(state)
    assert ids(list(second)) == epochs[1]


def test_resume_iterable_dataset_does_not_repeat_batches() -> None:
    full = ids(list(DataLoader(IterData(20, "int"), batch_size=3, num_workers=2)))
    first = DataLoader(IterData(20, "int"), batch_size=3, num_workers=2)
    it = iter(first)
    taken = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    del it
    second = DataLoader(IterData(20, "int"), batch_size=3, num_workers=2)
    second.load_state_dict(state)
    assert taken + ids(list(second)) == full


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

    # num_workers=6 would give 8 loads and 6 processes at once by default
    loader = DataLoader(Probed(), batch_size=4, num_workers=6, io_concurrency=3, cpu_concurrency=2)
    assert [i for b in ids(list(loader)) for i in b] == list(range(30))
    assert io.max == 3
    assert cpu.max == 2


def test_async_load_concurrency_is_respected() -> None:
    bound = 4
    state = {"current": 0, "max": 0, "arrivals": 0}
    full: dict[str, asyncio.Event] = {}

    class AsyncProbed(StagedDataset):
        def __len__(self) -> int:
            return 30

        async def load(self, i: int) -> int:
            ev = full.setdefault("ev", asyncio.Event())
            state["current"] += 1
            state["max"] = max(state["max"], state["current"])
            state["arrivals"] += 1
            if state["arrivals"] == bound:
                ev.set()
            if state["arrivals"] <= bound:
                await asyncio.wait_for(ev.wait(), WAIT)
            state["current"] -= 1
            return i

    loader = DataLoader(AsyncProbed(), batch_size=4, num_workers=2, io_concurrency=bound)
    assert [i for b in ids(list(loader)) for i in b] == list(range(30))
    assert state["max"] == bound


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


# -- 7. worker processes -----------------------------------------------------------------------
def test_process_workers_match_torch() -> None:
    ds = ProcessData(20)
    ref = list(TorchDataLoader(ds, batch_size=4, shuffle=True, generator=gen(2)))
    ours = DataLoader(
        ds, batch_size=4, shuffle=True, generator=gen(2), num_workers=2, worker_type="process"
    )
    assert_same_batches(list(ours), ref)


def test_persistent_process_workers_match_torch_over_epochs() -> None:
    ds = ProcessData(12, with_pid=True)
    ref = TorchDataLoader(ds, batch_size=4, shuffle=True, generator=gen(2))
    ours = DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        generator=gen(2),
        num_workers=2,
        worker_type="process",
        persistent_workers=True,
    )
    pids = set()
    for _ in range(2):
        got, want = list(ours), list(ref)
        for batch in got:
            pids.update(batch.pop("pid").tolist())
        for batch in want:
            batch.pop("pid")
        assert_same_batches(got, want)
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2  # the same (persistent) processes served both epochs
    ours.shutdown()


def test_process_worker_error_reaches_caller() -> None:
    loader = DataLoader(
        ProcessBadData(12, bad=7), batch_size=4, num_workers=2, worker_type="process"
    )
    with pytest.raises(KeyError) as exc:
        list(loader)
    notes = " ".join(getattr(exc.value, "__notes__", []))
    assert "7" in notes and "getitem" in notes, notes


def test_process_workers_run_worker_init_fn() -> None:
    loader = DataLoader(
        ProcessWorkerInfoData(6),
        batch_size=None,
        num_workers=2,
        worker_type="process",
        worker_init_fn=mark_init,
    )
    got = list(loader)
    assert [s["i"] for s in got] == list(range(6))
    assert all(s["init_ran"] for s in got)
    assert all(s["has_info"] for s in got)


def test_default_collate_of_sample_kinds_sanity() -> None:
    """The matrix's sample kinds collate as expected (guards the reference itself)."""
    batch = default_collate([make_sample(i, "dict") for i in range(3)])
    assert batch["name"] == ["s0", "s1", "s2"]
    assert torch.equal(batch["y"], torch.tensor([0, 1, 2]))
