"""DistributedRandomSampler: shard indices by rank, reshuffle every epoch."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

__all__ = ["DistributedRandomSampler", "detect_rank_and_world_size"]


def detect_rank_and_world_size() -> tuple[int, int]:
    """Rank and world size from ``torch.distributed`` if initialised, else ``RANK`` /
    ``WORLD_SIZE`` (as set by torchrun and Lightning), else a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve_rank_and_world_size(
    rank: int | None = None, world_size: int | None = None
) -> tuple[int, int]:
    """``rank`` and ``world_size`` where given, else detected; raises if they disagree."""
    detected_rank, detected_world = detect_rank_and_world_size()
    rank = detected_rank if rank is None else rank
    world = detected_world if world_size is None else world_size
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"invalid rank {rank} for world_size {world}")
    return rank, world


class DistributedRandomSampler:
    """Yields this rank's share of ``range(n)`` in an order reshuffled every epoch.

    All ranks draw the same permutation (from ``seed + epoch``) and rank ``r`` takes every
    ``world_size``-th index from position ``r``, so across ranks each index appears once per
    epoch. When ``n`` does not divide evenly, ``drop_last=False`` pads with indices from the
    start of the permutation so that every rank yields ``ceil(n / world_size)`` (a few
    samples are seen twice per epoch, as with torch's ``DistributedSampler``), and
    ``drop_last=True`` drops the tail so every rank yields ``n // world_size``.
    Call :meth:`set_epoch` before each epoch; ``shuffle=False`` keeps index order.
    """

    def __init__(
        self,
        n: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        self.rank, self.world_size = resolve_rank_and_world_size(rank, world_size)
        self.n = n
        self.seed = seed
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch`` for the next iteration."""
        self.epoch = epoch

    def __len__(self) -> int:
        if self.drop_last:
            return self.n // self.world_size
        return -(-self.n // self.world_size)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=gen).tolist()
        else:
            order = list(range(self.n))
        total = len(self) * self.world_size
        if total > len(order) and order:
            reps = -(-total // len(order))
            order = (order * reps)[:total]
        else:
            order = order[:total]
        return iter(order[self.rank : total : self.world_size])
