"""``MixedSampler``: this rank's share of a :class:`~._weighted_mix.WeightedMix` epoch.

The sampler side of a mix, for a loader over the mix itself (a map-style dataset, the
concatenation of the sources): ``DataLoader(mix, sampler=MixedSampler(mix))`` with
``torch_spdl.DataLoader`` or torch's, or ``PipelineBuilder().add_source(sampler)``
followed by ``.pipe(mix.__getitem__)``. The dealing and the elastic state are
:class:`~._elastic_sampler.ElasticSampler`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from ._elastic import identity
from ._elastic_sampler import ElasticSampler
from ._weighted_mix import WeightedMix

__all__ = ["MixedSampler"]


class MixedSampler(ElasticSampler):
    """Yields this rank's share of each epoch's global order of ``mix``: indices of
    the concatenation (``mix[i]`` loads one).

    Rank ``r`` of ``W`` takes every ``W``-th position of the order from ``r``, so across
    ranks every position is dealt once (``even_out`` pads or trims the tail as
    ``DistributedSampler`` does). Call :meth:`set_epoch` before each epoch.
    :meth:`state_dict` / :meth:`load_state_dict` resume an epoch at another world size
    (docs/mixing.md).

    Args:
        mix: the mix (its datasets, weights, policy, epoch length and seed).
        rank: this process's rank (default: detected).
        world_size: the number of ranks (default: detected).
        even_out: the same count on every rank (default), padded with the start of the
            order or, with ``drop_last``, trimmed; False: every position once.
        drop_last: trim instead of padding.
    """

    def __init__(
        self,
        mix: WeightedMix,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        even_out: bool = True,
        drop_last: bool = False,
    ) -> None:
        if not isinstance(mix, WeightedMix):
            raise TypeError(f"MixedSampler takes a WeightedMix, got {type(mix).__name__}")
        super().__init__(rank=rank, world_size=world_size, even_out=even_out, drop_last=drop_last)
        self.mix = mix
        self._cache: tuple[int, torch.Tensor] | None = None

    def _global_order(self) -> torch.Tensor:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self.mix.order(self.epoch))
        return self._cache[1]

    def _identity(self) -> dict[str, Any]:
        mix = self.mix
        return identity("mix", mix.seed, self.epoch, mix.samples_per_epoch(), mix.fingerprint())

    def __repr__(self) -> str:
        return (
            f"MixedSampler(rank={self.rank}, world_size={self.world_size}, epoch={self.epoch}, "
            f"{len(self)} indices, {self.mix!r})"
        )
