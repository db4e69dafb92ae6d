"""DistributedRandomSampler: shard indices by rank, reshuffle every epoch."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

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
    """``rank`` and ``world_size`` where given, else detected; raises if they disagree.

    Args:
        rank: this process's rank, or None to detect it.
        world_size: the number of ranks, or None to detect it.

    Raises:
        ValueError: when ``world_size < 1`` or ``rank`` is not in ``[0, world_size)``.
    """
    detected_rank, detected_world = detect_rank_and_world_size()
    rank = detected_rank if rank is None else rank
    world = detected_world if world_size is None else world_size
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"invalid rank {rank} for world_size {world}")
    return rank, world


class _Shuffle:
    """``sampler.shuffle``: SPDL's ``shuffle(seed=)`` method that is also our flag.

    Our signature has a ``shuffle=True/False`` flag (torch's convention) and SPDL's has a
    ``shuffle(seed=...)`` method, both under one name: this object is truthy as the flag
    and, called, reseeds the sampler as SPDL's method does.
    """

    __slots__ = ("_sampler",)

    def __init__(self, sampler: DistributedRandomSampler) -> None:
        self._sampler = sampler

    def __bool__(self) -> bool:
        return self._sampler._shuffle_flag

    def __eq__(self, other: object) -> bool:
        return bool(self) == other

    def __hash__(self) -> int:
        return hash(bool(self))

    def __repr__(self) -> str:
        return repr(bool(self))

    def __call__(self, seed: int) -> None:
        """Use the order drawn from ``seed`` from the next iteration on (SPDL)."""
        self._sampler._order_seed = seed


class DistributedRandomSampler:
    """Yields this rank's share of ``range(n)`` in an order reshuffled every epoch.

    All ranks draw the same permutation (from ``seed + epoch``) and rank ``r`` takes every
    ``world_size``-th index from position ``r``, so across ranks each index appears once per
    epoch. When ``n`` does not divide evenly, ``drop_last=False`` pads with indices from the
    start of the permutation so that every rank yields ``ceil(n / world_size)`` (a few
    samples are seen twice per epoch, as with torch's ``DistributedSampler``), and
    ``drop_last=True`` drops the tail so every rank yields ``n // world_size``.
    Call :meth:`set_epoch` before each epoch; ``shuffle=False`` keeps index order.

    SPDL's signature works too: ``num_draws`` indices per epoch (across ranks) instead of
    ``n``, drawn with replacement in proportion to ``weights`` when given, and
    ``sampler.shuffle(seed=s)`` picks the order drawn from ``s`` for the next iterations
    (``sampler.shuffle`` is also the ``shuffle`` flag: truthy when shuffling).

    Args:
        n: the dataset size (indices ``0 .. n-1``).
        rank: this process's rank (default: detected).
        world_size: how many ranks (default: detected).
        seed: the base seed of the permutations.
        drop_last: drop the uneven tail instead of padding it.
        shuffle: False keeps index order.
        num_draws: SPDL: how many indices each epoch draws across ranks (default ``n``).
        weights: SPDL: one weight per index; indices are then drawn with replacement.
    """

    def __init__(
        self,
        n: int,
        /,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        shuffle: bool = True,
        num_draws: int | None = None,
        weights: Sequence[float] | None = None,
    ) -> None:
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if num_draws is not None and num_draws < 0:
            raise ValueError(f"num_draws must be non-negative, got {num_draws}")
        if weights is not None and len(weights) != n:
            raise ValueError(f"weights must have one value per index ({n}), got {len(weights)}")
        self.rank, self.world_size = resolve_rank_and_world_size(rank, world_size)
        self.n = n
        self.seed = seed
        self.drop_last = drop_last
        self._shuffle_flag = bool(shuffle)
        self.num_draws = n if num_draws is None else num_draws
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.double)
        self.epoch = 0
        self._order_seed: int | None = None  # set by SPDL's shuffle(seed=)

    @property
    def shuffle(self) -> _Shuffle:
        """Truthy when the order is shuffled; call it as ``shuffle(seed=s)`` (SPDL)."""
        return _Shuffle(self)

    @shuffle.setter
    def shuffle(self, value: bool) -> None:
        self._shuffle_flag = bool(value)

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch`` for the next iteration."""
        self.epoch = epoch
        self._order_seed = None

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_draws // self.world_size
        return -(-self.num_draws // self.world_size)

    def _draw(self) -> list[int]:
        seed = self.seed + self.epoch if self._order_seed is None else self._order_seed
        gen = torch.Generator().manual_seed(seed)
        if self.weights is not None:
            if self.num_draws == 0:
                return []
            return torch.multinomial(
                self.weights, self.num_draws, replacement=True, generator=gen
            ).tolist()
        if self._shuffle_flag:
            order = torch.randperm(self.n, generator=gen).tolist()
        else:
            order = list(range(self.n))
        if self.num_draws != self.n and order:  # SPDL's num_draws: cycle or cut the order
            reps = -(-self.num_draws // len(order))
            order = (order * reps)[: self.num_draws]
        return order

    def __iter__(self) -> Iterator[int]:
        order = self._draw()
        total = len(self) * self.world_size
        if total > len(order) and order:
            reps = -(-total // len(order))
            order = (order * reps)[:total]
        else:
            order = order[:total]
        return iter(order[self.rank : total : self.world_size])
