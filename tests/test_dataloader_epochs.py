"""``torch_spdl.DataLoader`` over epochs: each ``iter`` a new epoch like torch's, worker
initialisation, persistent workers and ``get_worker_info``.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import collections
import gc
import threading
from typing import Any

import pytest
import torch
from _dl_helpers import (
    MapData,
    N,
    assert_no_pipeline_threads,
    gen,
    ids,
)
from _sync import WAIT
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import (
    Dataset,
)
from torch.utils.data.distributed import DistributedSampler

from torch_spdl import DataLoader, get_worker_info


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


class _WorkerDraws(Dataset):
    """Each sample drawn from its worker's torch RNG, which persistent workers keep."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[int, float]:
        return i, float(torch.rand(()))


@pytest.mark.parametrize("batch_size", [3, 4])
def test_persistent_workers_draw_the_base_seed_once_like_torch(batch_size: int) -> None:
    # torch draws its workers' base seed from the loader's generator when it starts them,
    # and not in later epochs (it resets its iterator): the later epochs' shuffles then
    # differ from a loader whose workers are started anew. 7 batches over 3 workers.
    def epochs(cls: Any) -> list[Any]:
        loader = cls(
            _WorkerDraws(), batch_size=batch_size, shuffle=True, generator=gen(5),
            num_workers=3, persistent_workers=True,
        )
        return [[b[0].tolist(), b[1].tolist()] for _ in range(3) for b in loader]

    assert epochs(DataLoader) == epochs(TorchDataLoader)


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
        worker_type="thread",  # the tracker counts in this process
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
    loader = DataLoader(
        ds, batch_size=4, num_workers=num_workers, generator=gen(3), worker_type="thread"
    )
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
