"""``ElasticSampler``: a global order per epoch, dealt to ranks, resumable on another
world size.

What the distributed samplers share: an epoch is one global order (drawn from the seed
and the epoch, never from the world size), rank ``r`` of ``W`` takes every ``W``-th of
what is left of it (``_deal.Split``), and the state a rank saves is how much of its
share the training loop received (``_elastic``). Loading the states of every rank of a
run at ``W`` ranks makes each of ``W'`` new samplers take its share of exactly the
positions no rank delivered; the next epoch starts whole again. Subclasses say what the
global order is: :class:`~torch_spdl.source.DistributedRandomSampler` (a permutation)
and :class:`~torch_spdl.source.MixedSampler` (a weighted mix).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ._deal import Blocks, Delivered, Split
from ._elastic import ResumePoint, consumer_entry, merge, rank_record
from ._ranks import resolve_rank_and_world_size

__all__ = ["ElasticSampler"]


class ElasticSampler:
    """Base of the samplers whose epoch is a global order dealt to ranks.

    A subclass defines ``_global_order()`` (the current epoch's order, a list or an int64
    tensor of indices) and ``_identity()`` (what identifies that order in a saved state).

    Args:
        rank: this process's rank (default: detected from ``torch.distributed``, else
            ``RANK``).
        world_size: the number of ranks (default: detected, else ``WORLD_SIZE``).
        even_out: give every rank the same count (DDP needs it) by padding with the
            start of the order, or trimming with ``drop_last``; False deals every index
            once, some ranks one more.
        drop_last: with ``even_out``, trim the uneven tail instead of padding.
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        even_out: bool = True,
        drop_last: bool = False,
    ) -> None:
        self.rank, self.world_size = resolve_rank_and_world_size(rank, world_size)
        self.even_out = bool(even_out)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._resume: ResumePoint | None = None
        self._yielded = 0
        self._iterated: int | None = None  # the epoch the last iteration was of
        self._finished: int | None = None  # ... and the epoch it gave out all of

    # -- what a subclass defines -------------------------------------------------------------
    def _global_order(self) -> list[int] | torch.Tensor:
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def _adopt(self, order: dict[str, Any]) -> None:
        """Take the epoch (and whatever else selects the order) of a saved state."""
        self.epoch = int(order["epoch"])

    # -- the epoch -----------------------------------------------------------------------------
    @property
    def split(self) -> Split:
        """How the rest of an epoch is dealt to the ranks."""
        return Split(self.world_size, self.even_out, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch`` for the next iteration (a resume point loaded for
        another epoch no longer applies)."""
        self.epoch = epoch

    @property
    def resume_point(self) -> ResumePoint | None:
        """The resume point of the current epoch, if one was loaded for it (and the order
        was not reseeded since)."""
        point = self._resume
        if point is None or point.epoch != self.epoch:
            return None
        return point if point.order.get("seed") == self._identity()["seed"] else None

    def _before(self) -> Delivered:
        point = self.resume_point
        if point is not None:
            return point.delivered
        return Delivered(int(self._identity()["length"]))

    def __len__(self) -> int:
        return self.split.share_length(self._before().remaining, self.rank)

    def __iter__(self) -> Iterator[int]:
        values = self.share()
        self._yielded, self._iterated, self._finished = 0, self.epoch, None
        return self._counted(values)

    def share(self) -> list[int]:
        """This rank's indices of the current epoch (what iterating yields), as a list."""
        before = self._before()
        order = self._global_order()
        split = self.split
        if isinstance(order, list) and not before.watermark and not before.extra:
            return _plain_share(order, split, self.rank)  # a whole epoch: slicing
        positions = before.positions(split.indices(before.remaining, self.rank))
        if isinstance(order, list):
            return [order[p] for p in positions.tolist()]
        return order[positions].tolist()

    def _counted(self, values: list[int]) -> Iterator[int]:
        epoch = self.epoch
        for value in values:
            self._yielded += 1
            yield value
        self._finished = epoch

    # -- elastic state -------------------------------------------------------------------------
    def state_dict(
        self, delivered: int | None = None, *, extra: Iterable[int] = ()
    ) -> dict[str, Any]:
        """This rank's state: how much of its share of the epoch the training loop received.

        Save it on every rank; :meth:`load_state_dict` of the list of all of them resumes at
        any world size (and any number of loader workers).

        Args:
            delivered: how many of this rank's samples, in the order this sampler yields
                them, the training loop received (steps x batch size). Default: how many
                the sampler has yielded this epoch, which counts those a loader fetched
                ahead and has not delivered; with a ``torch_spdl.DataLoader`` use
                :func:`~torch_spdl.source.elastic_state` instead, which reads the count of
                delivered batches from the loader.
            extra: positions (in this rank's order) received beyond the first
                ``delivered``, when batches are delivered out of order.
        """
        if delivered is None:
            delivered = self._yielded if self._iterated == self.epoch else 0
        if delivered < 0:
            raise ValueError(f"delivered must be >= 0, got {delivered}")
        entry = consumer_entry(Blocks(), delivered, extra)
        return rank_record(self._identity(), self._before(), self.split, self.rank, [entry])

    def load_state_dict(self, states: Any) -> None:
        """Resume an epoch from the states of every rank of the run that saved them.

        The saved world size, this one and the loaders' workers may all differ: the rest of
        the saved epoch, exactly the samples no rank delivered, is dealt to this world
        size; its next iteration yields this rank's share of it (``len()`` says how many),
        and the epoch after it is whole again. ``set_epoch`` of the saved epoch keeps the
        resume point (Lightning calls it); of another epoch, drops it.

        Do not also restore the loader's own state: it counts batches of the saved
        shares, and would skip that many of the new one.

        Args:
            states: the list of every rank's :meth:`state_dict` (or
                :func:`~torch_spdl.source.elastic_state`); one state for a world of one; or a
                :class:`~torch_spdl.source.ResumePoint`.

        Raises:
            ValueError: when a rank's state is missing, the states are of different epochs,
                or of another order (other datasets, weights, policy or seed).
        """
        point = states if isinstance(states, ResumePoint) else merge(states)
        self._adopt(point.order)
        point.check(self._identity(), type(self).__name__)
        self._resume = point


def _plain_share(order: list[int], split: Split, rank: int) -> list[int]:
    """Rank ``rank``'s share of a whole epoch's ``order``, as list slices."""
    n = split.share_length(len(order), rank)
    if not split.even_out:
        return order[rank :: split.world_size]
    total = n * split.world_size
    if total > len(order) and order:
        order = (order * -(-total // len(order)))[:total]
    return order[rank : total : split.world_size]
