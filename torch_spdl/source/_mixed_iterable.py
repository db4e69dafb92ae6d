"""``MixedIterableDataset``: a :class:`~._weighted_mix.WeightedMix` as an
``IterableDataset`` that deals itself to ranks and loader workers.

For the loaders and modules that take a stream (``StagedDataModule``, a
``PipelineBuilder`` source, torch's loader with an iterable dataset): each rank takes its
share of the epoch's global order (``MixedSampler``'s, so the two agree), and each worker
of the rank takes blocks of ``batch_size`` of that share in turn (``_deal.Blocks``), so a
loader that takes the workers' batches in turn delivers a prefix of the rank's share.

Its ``state_dict`` / ``load_state_dict`` are torch's *Stateful* protocol, per worker:
``torch_spdl.DataLoader`` carries each worker's state back with its batches and hands it
back on a resume at the same world size and worker count. A resume at another shape goes
through the ranks' merged states instead (:func:`~torch_spdl.source.elastic_state` on
each rank, then :meth:`MixedIterableDataset.load_state_dict` of the list, on a fresh
loader).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from ._deal import Blocks, Delivered
from ._elastic import FORMAT, ResumePoint, consumer_entry, rank_record
from ._mixed_sampler import MixedSampler
from ._weighted_mix import WeightedMix

__all__ = ["MixedIterableDataset"]


class MixedIterableDataset(torch.utils.data.IterableDataset[Any]):
    """The samples of ``mix``, this rank's and this worker's share of each epoch.

    Across ranks and workers every position of the epoch's global order is delivered
    once (``even_out`` pads or trims the ranks' tail as ``MixedSampler`` does). Call
    :meth:`set_epoch` before each epoch (``StagedDataModule`` does).

    Args:
        mix: the mix to load (``mix[i]`` loads a sample).
        rank: this process's rank (default: detected).
        world_size: the number of ranks (default: detected).
        batch_size: the block each worker takes in turn; the loader's batch size makes
            a rank's delivered samples a prefix of its share, and its state a count.
        even_out: the same count on every rank (default); False: every position once.
        drop_last: trim the ranks' uneven tail instead of padding it.
    """

    def __init__(
        self,
        mix: WeightedMix,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        batch_size: int = 1,
        even_out: bool = True,
        drop_last: bool = False,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.mix = mix
        self.batch_size = batch_size
        self._ranks = MixedSampler(
            mix, rank=rank, world_size=world_size, even_out=even_out, drop_last=drop_last
        )
        self.rank, self.world_size = self._ranks.rank, self._ranks.world_size
        self.epoch = 0
        self._progress: tuple[int, Blocks, int] | None = None  # epoch, consumer, count
        self._continue: tuple[int, Blocks, int] | None = None  # from a worker's own state

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch`` for the next iteration."""
        self._ranks.set_epoch(epoch)
        self.epoch = epoch

    def __len__(self) -> int:
        """This rank's samples this epoch (all its workers together)."""
        return len(self._ranks)

    def _consumer(self, worker: int | None = None, num_workers: int | None = None) -> Blocks:
        if worker is not None or num_workers is not None:
            return Blocks(worker or 0, num_workers or 1, self.batch_size)
        info = torch.utils.data.get_worker_info()
        if info is None:
            return Blocks(0, 1, self.batch_size)
        return Blocks(info.id, info.num_workers, self.batch_size)

    def indices(self, worker: int | None = None, num_workers: int | None = None) -> list[int]:
        """The indices of ``mix`` one consumer yields this epoch, in order (before any
        position it restored from its own state).

        Args:
            worker: the loader worker (default: the calling worker's id, 0 outside one).
            num_workers: the rank's loader workers (default: the calling worker's count).
        """
        consumer = self._consumer(worker, num_workers)
        share = torch.tensor(self._ranks.share(), dtype=torch.int64)
        return share[consumer.share_indices(len(share))].tolist()

    def __iter__(self) -> Iterator[Any]:
        consumer = self._consumer()
        mine = self.indices(consumer.worker, consumer.num_workers)
        start = 0
        if self._continue is not None and self._continue[:2] == (self.epoch, consumer):
            start = self._continue[2]
        self._progress = (self.epoch, consumer, start)
        return self._samples(mine, consumer, start)

    def _samples(self, mine: list[int], consumer: Blocks, start: int) -> Iterator[Any]:
        count = start
        for index in mine[start:]:
            sample = self.mix[index]
            count += 1
            self._progress = (self.epoch, consumer, count)
            yield sample

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This consumer's state (in a loader worker: that worker's): what it yielded of
        its sequence this epoch. ``torch_spdl.DataLoader`` takes it with each batch."""
        consumer = self._consumer()
        ranks = self._ranks
        progress = self._progress
        mine = progress is not None and progress[:2] == (self.epoch, consumer)
        entry = consumer_entry(consumer, progress[2] if progress is not None and mine else 0)
        return rank_record(ranks._identity(), ranks._before(), ranks.split, self.rank, [entry])

    def rank_state(self, delivered: Sequence[int]) -> dict[str, Any]:
        """This rank's elastic state, from how many samples each of its loader workers
        delivered this epoch (``delivered[k]``: worker ``k``'s, in the order of
        :meth:`indices`; one count without workers).
        :func:`~torch_spdl.source.elastic_state` reads them from a ``torch_spdl.DataLoader``.
        """
        ranks = self._ranks
        workers = len(delivered)
        if workers < 1:
            raise ValueError("rank_state needs one count per worker (one without workers)")
        entries = [
            consumer_entry(Blocks(k, workers, self.batch_size), count)
            for k, count in enumerate(delivered)
        ]
        return rank_record(ranks._identity(), ranks._before(), ranks.split, self.rank, entries)

    def worker_counts(self, loader_state: Mapping[str, Any], num_workers: int) -> list[int]:
        """How many samples each worker delivered, read from a ``torch_spdl.DataLoader``'s
        ``state_dict()`` (each worker's state as of the last batch received; a worker not
        heard from yet delivered nothing; an epoch that ended delivered everything).

        Args:
            loader_state: the loader's ``state_dict()``.
            num_workers: the loader's ``num_workers``.
        """
        workers = max(num_workers, 1)
        if loader_state.get("exhausted"):  # the epoch set on this dataset was delivered
            share = len(self._ranks)
            return [Blocks(k, workers, self.batch_size).length(share) for k in range(workers)]
        counts = [0] * workers
        if loader_state.get("rng_state") is None:
            return counts
        states = dict(loader_state.get("dataset_states") or {})
        if "dataset_state" in loader_state:
            states = {0: loader_state["dataset_state"]}
        for wid, state in states.items():
            counts[int(wid)] = _worker_count(state, self._ranks._identity(), int(wid), workers)
        return counts

    def load_state_dict(self, state: Any) -> None:
        """Resume. Given one worker's own state (``torch_spdl.DataLoader`` does that in
        each worker, at the same world size and worker count), that worker goes on where
        it was. Given the list of every rank's :func:`~torch_spdl.source.elastic_state`,
        the rest of the saved epoch is dealt to this world size and worker count (do not
        restore the loader's state then).

        Raises:
            ValueError: for a worker's state of another shape, or what
                :meth:`MixedSampler.load_state_dict` raises.
        """
        if isinstance(state, Mapping) and len(state.get("consumers", ())) == 1:
            if self._resume_own(state):
                return
        self._ranks.load_state_dict(state)
        self.epoch = self._ranks.epoch
        self._continue = None

    def _resume_own(self, state: Mapping[str, Any]) -> bool:
        """Go on from a worker's own state, if it is this consumer's."""
        (entry,) = state["consumers"]
        saved = Blocks(int(entry["worker"]), int(entry["num_workers"]), int(entry["block"]))
        here = self._consumer()
        split = state["split"]
        if split["world_size"] == 1 and saved.num_workers == 1 and here.num_workers == 1:
            return False  # the whole run's state: a rebase does the same, and composes
        if (saved, state["rank"], split) != (here, self.rank, self._ranks.split.as_dict()):
            raise ValueError(
                f"the state is of worker {saved.worker} of {saved.num_workers} at rank "
                f"{state['rank']} of {split['world_size']}; here worker {here.worker} of "
                f"{here.num_workers} at rank {self.rank} of {self.world_size}. To resume on "
                "another number of workers or ranks, do not restore the loader's state: load "
                "the list of every rank's elastic_state(loader) into the dataset "
                "(docs/mixing.md)"
            )
        self._ranks.load_state_dict(_as_whole(state))
        self.epoch = self._ranks.epoch
        self._continue = (self.epoch, here, int(entry["delivered"]))
        return True

    def __repr__(self) -> str:
        return (
            f"MixedIterableDataset(rank={self.rank}, world_size={self.world_size}, "
            f"batch_size={self.batch_size}, {self.mix!r})"
        )


def _as_whole(state: Mapping[str, Any]) -> ResumePoint:
    """The resume point a worker's state was dealt from (its epoch's order, and what had
    been delivered before it): the worker then goes on from its own count."""
    return ResumePoint(dict(state["order"]), Delivered.from_dict(state["delivered_before"]))


def _worker_count(
    state: Mapping[str, Any], order: Mapping[str, Any], wid: int, workers: int
) -> int:
    """How many samples worker ``wid`` delivered, by its own state."""
    if state.get("format") != FORMAT or state["order"] != order:
        raise ValueError(f"worker {wid}'s state is not of this dataset's current epoch")
    (entry,) = state["consumers"]
    if (entry["worker"], entry["num_workers"]) != (wid, workers):
        raise ValueError(
            f"worker {wid}'s state names worker {entry['worker']} of {entry['num_workers']}"
        )
    return int(entry["delivered"])
