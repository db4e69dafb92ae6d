"""``torch_spdl.DataLoader`` with ``worker_type="process"``: results like torch's, over
epochs, errors and ``worker_init_fn``.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import os

import pytest
import torch
from _dl_helpers import (
    ProcessBadData,
    ProcessData,
    ProcessWorkerInfoData,
    ShardedByWorker,
    assert_same_batches,
    gen,
    mark_init,
)
from torch.utils.data import DataLoader as TorchDataLoader

from torch_spdl import DataLoader


# -- 7. worker processes -----------------------------------------------------------------------
def test_process_workers_match_torch() -> None:
    ds = ProcessData(20)
    ref = list(TorchDataLoader(ds, batch_size=4, shuffle=True, generator=gen(2)))
    ours = DataLoader(
        ds, batch_size=4, shuffle=True, generator=gen(2), num_workers=2, worker_type="process"
    )
    assert_same_batches(list(ours), ref)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_process_workers_started_without_fork_match_torch(context: str) -> None:
    """A worker started by ``spawn`` or ``forkserver`` imports what it runs by name (its
    main function, the messages it reads and writes, the dataset): batches, a failed
    sample and an iterable dataset's shards come back as from torch's forked workers."""
    ds = ProcessData(12)
    ref = list(TorchDataLoader(ds, batch_size=4, shuffle=True, generator=gen(3)))
    ours = DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        generator=gen(3),
        num_workers=2,
        worker_type="process",
        multiprocessing_context=context,
    )
    assert_same_batches(list(ours), ref)
    iterable = ShardedByWorker(10)
    want = list(TorchDataLoader(iterable, batch_size=3, num_workers=2))
    got = DataLoader(iterable, batch_size=3, num_workers=2, multiprocessing_context=context)
    assert_same_batches(list(got), want)
    bad = DataLoader(
        ProcessBadData(8, bad=5),
        batch_size=4,
        num_workers=2,
        worker_type="process",
        multiprocessing_context=context,
    )
    with pytest.raises(KeyError, match="no sample 5"):
        list(bad)


def test_persistent_process_workers_match_torch_over_epochs() -> None:
    ds = ProcessData(12, with_pid=True)
    # torch's own persistent workers: their base seed is drawn once, for the first epoch
    ref = TorchDataLoader(
        ds, batch_size=4, shuffle=True, generator=gen(2), num_workers=2, persistent_workers=True
    )
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


class _Mixed(torch.utils.data.Dataset):
    """Samples with an empty tensor, a string and an int."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, object]:
        return {
            "empty": torch.empty(0, 3),
            "path": f"img_{i}.jpg",
            "i": i,
        }


def _twice(samples: list[dict[str, object]]) -> dict[str, object]:
    """A collate that puts one tensor in the batch twice, and adds one that needs grad."""
    batch = torch.utils.data.default_collate(samples)
    batch["again"] = batch["i"]
    batch["grad"] = batch["i"].float().requires_grad_()
    return batch


@pytest.mark.parametrize("collate_fn", [None, _twice])
def test_batches_of_empty_tensors_and_repeated_ones_come_back_as_torchs(collate_fn) -> None:
    ds = _Mixed()
    kwargs = {"batch_size": 4, "num_workers": 2, "collate_fn": collate_fn}
    got = list(DataLoader(ds, worker_type="process", **kwargs))
    want = list(TorchDataLoader(ds, **kwargs))
    assert len(got) == len(want) == 2
    for ours, theirs in zip(got, want, strict=True):
        assert ours.keys() == theirs.keys()
        assert ours["empty"].shape == theirs["empty"].shape == (4, 0, 3)
        assert ours["path"] == theirs["path"]
        assert torch.equal(ours["i"], theirs["i"])
        if collate_fn is not None:  # one tensor in the batch is one tensor out of it
            assert ours["again"] is ours["i"]
            assert theirs["again"] is theirs["i"]
            assert torch.equal(ours["grad"], theirs["grad"])
            assert ours["grad"].requires_grad and theirs["grad"].requires_grad


class _Empty(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.empty(0, 3)


def test_a_batch_of_empty_tensors_only_comes_back() -> None:
    got = list(DataLoader(_Empty(), batch_size=2, num_workers=2, worker_type="process"))
    assert [b.shape for b in got] == [(2, 0, 3), (2, 0, 3)]


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


@pytest.mark.parametrize("in_order", [True, False])  # fed by next() itself, or a pipeline
def test_closing_before_the_first_batch_stops_the_worker_processes(in_order: bool) -> None:
    """The worker processes start with the epoch, before any batch is asked for; the
    epoch's pipeline owns them (running or not), so closing the epoch stops them."""
    loader = DataLoader(ProcessData(20), batch_size=4, num_workers=2, in_order=in_order)
    epoch = iter(loader)
    workers = list(epoch._workers)  # torch's iterator's name for them
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    epoch.close()
    assert not any(w.is_alive() for w in workers)
    assert all(w.exitcode is not None for w in workers)


class _ImageStream(torch.utils.data.IterableDataset):
    """Large per-worker image samples (a batch of 8 is 1.2 MB: stacked into the arena)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        wid = 0 if info is None else info.id
        for i in range(24):
            image = torch.full((3, 224, 224), (wid * 31 + i) % 251, dtype=torch.uint8)
            yield image, wid * 100 + i


def test_iterable_image_batches_held_by_the_loop_match_torch() -> None:
    """An ``IterableDataset``'s worker stacks large batches straight into the shared arena:
    every batch, all held at once by the loop (so arenas cannot be reused under them),
    equals torch's."""
    ref = list(TorchDataLoader(_ImageStream(), batch_size=8, num_workers=2))
    ours = list(DataLoader(_ImageStream(), batch_size=8, num_workers=2, worker_type="process"))
    assert_same_batches(ours, ref)
