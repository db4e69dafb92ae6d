"""``torch_spdl.DataLoader``'s ``state_dict``/``load_state_dict``: a resumed loader delivers
exactly the batches it had not delivered, and reads nothing else.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import pytest
import torch
from _dl_helpers import (
    IterData,
    MapData,
    N,
    gen,
    ids,
)
from _sync import WAIT
from torch.utils.data import (
    Dataset,
)
from torch.utils.data.distributed import DistributedSampler

import torch_spdl


def DataLoader(*args: Any, **kwargs: Any) -> torch_spdl.DataLoader:  # noqa: N802
    """torch_spdl's loader on worker threads: these tests count the reads of each sample
    in this process (the default, worker processes, is resumed in
    test_resume_with_worker_processes below)."""
    kwargs.setdefault("worker_type", "thread")
    return torch_spdl.DataLoader(*args, **kwargs)


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


@pytest.mark.parametrize("k", [1, 6])
def test_resume_with_worker_processes(k: int) -> None:
    """The default loader (worker processes, seeded as torch's): a state taken after ``k``
    batches resumes to exactly the rest of the epoch."""

    def make() -> torch_spdl.DataLoader:
        return torch_spdl.DataLoader(
            MapData(40, "int"), batch_size=3, shuffle=True, generator=gen(5), num_workers=2
        )

    full = ids(list(make()))
    first = make()
    it = iter(first)
    taken = [next(it).tolist() for _ in range(k)]
    state = first.state_dict()
    del it
    second = make()
    second.load_state_dict(state)
    assert taken + ids(list(second)) == full
