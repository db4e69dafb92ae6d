"""DistributedRandomSampler: shard indices by rank, reshuffle every epoch.

Its epoch is one permutation for ``(seed, epoch)``, the same at every world size, dealt
to the ranks by :class:`~._elastic_sampler.ElasticSampler`: so a state saved at one world
size resumes at another, with exactly the indices no rank delivered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from ._elastic import identity
from ._elastic_sampler import ElasticSampler
from ._ranks import detect_rank_and_world_size, resolve_rank_and_world_size

__all__ = ["DistributedRandomSampler", "detect_rank_and_world_size", "resolve_rank_and_world_size"]


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


class DistributedRandomSampler(ElasticSampler):
    """Yields this rank's share of ``range(n)`` in an order reshuffled every epoch.

    All ranks draw the same permutation (from ``seed + epoch``) and rank ``r`` takes every
    ``world_size``-th index from position ``r``, so across ranks each index appears once per
    epoch. When ``n`` does not divide evenly, ``drop_last=False`` pads with indices from the
    start of the permutation so that every rank yields ``ceil(n / world_size)`` (a few
    samples are seen twice per epoch, as with torch's ``DistributedSampler``), and
    ``drop_last=True`` drops the tail so every rank yields ``n // world_size``.
    Call :meth:`set_epoch` before each epoch; ``shuffle=False`` keeps index order.

    The permutation does not depend on the world size, so the state of every rank
    (:meth:`ElasticSampler.state_dict`, or :func:`~torch_spdl.source.elastic_state` of a
    ``torch_spdl.DataLoader``) resumes the epoch at any other world size: the samplers
    that load the list of them (:meth:`ElasticSampler.load_state_dict`) yield exactly the
    indices no rank delivered, each once (the padding aside), see docs/mixing.md.

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
        super().__init__(rank=rank, world_size=world_size, even_out=True, drop_last=drop_last)
        self.n = n
        self.seed = seed
        self._shuffle_flag = bool(shuffle)
        self.num_draws = n if num_draws is None else num_draws
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.double)
        self._weights_digest = "" if self.weights is None else _digest(self.weights)
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
        super().set_epoch(epoch)
        self._order_seed = None

    def _order_seed_now(self) -> int:
        return self.seed + self.epoch if self._order_seed is None else self._order_seed

    def _identity(self) -> dict[str, Any]:
        config = f"n={self.n} shuffle={bool(self._shuffle_flag)} weights={self._weights_digest}"
        return identity("permutation", self._order_seed_now(), self.epoch, self.num_draws, config)

    def _adopt(self, order: dict[str, Any]) -> None:
        super()._adopt(order)
        seed = int(order["seed"])
        self._order_seed = None if seed == self.seed + self.epoch else seed

    def _global_order(self) -> list[int]:
        return self._draw()

    def _draw(self) -> list[int]:
        seed = self._order_seed_now()
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


def _digest(weights: torch.Tensor) -> str:
    return hashlib.blake2b(weights.numpy().tobytes(), digest_size=8).hexdigest()
