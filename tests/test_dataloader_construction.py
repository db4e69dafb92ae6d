"""``torch_spdl.DataLoader``'s constructor: what it accepts and rejects (as torch does), what
it holds, and that constructing it starts nothing.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import warnings
from typing import Any

import pytest
from _dl_helpers import (
    MapData,
    N,
    ProcessData,
    VarBatchSampler,
    gen,
    ids,
    list_collate,
    pipeline_threads,
)
from torch.utils.data import (
    BatchSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data.distributed import DistributedSampler

from torch_spdl import DataLoader


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
        {"worker_nice": -1},
        {"worker_nice": 1.5},
        {"worker_nice": True},
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
        DataLoader(MapData(4), num_workers=(os.cpu_count() or 1) * 8, worker_type="thread")


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
