"""``WeightedMix``: several map-style datasets as one, and the order an epoch mixes them in.

The mix is a dataset (the concatenation: index ``offsets[s] + i`` is sample ``i`` of
source ``s``, as ``torch.utils.data.ConcatDataset`` numbers them) and the plan of an
epoch: each source's count (``_apportion``: exact, from the weights, the policy and the
epoch length), and the *global order*, the epoch's sequence of concatenated indices,
drawn from ``(seed, epoch)`` alone. It never depends on the number of ranks or workers:
:class:`~torch_spdl.source.MixedSampler` and
:class:`~torch_spdl.source.MixedIterableDataset` deal it out, and a resume on another
world size deals out what is left of the same order.

The order is built in two draws, each on a generator of its own (``_seeds``): which
source each position takes (per phase, a uniform shuffle of the phase's counts, so
every prefix of the epoch holds the sources near their weights), and, per source, which
of its samples in turn (its own shuffle, a new one each pass when it cycles; or index
order with ``shuffle=False``). A source's samples therefore come in its own order.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Sequence, Sized
from typing import Any

import torch

from ._apportion import check_weights, phases, policy_quotas
from ._seeds import derive_seed, generator

__all__ = ["WeightedMix"]


class WeightedMix(torch.utils.data.Dataset[Any]):
    """Map-style datasets mixed by weight: one dataset (their concatenation) and the
    order of each epoch, deterministic for ``(seed, epoch)``.

    Policies (the counts are exact, see :meth:`quotas`):

    - ``"all_exhausted"`` (default): every sample of every source once per epoch; the
      weights set the proportions until a source runs out, which then leaves the mix.
    - ``"first_exhausted"``: the epoch ends when the first source runs out (no sample
      twice; the others give the share their weights ask for up to that point).
    - ``"cycle"``: the epoch ends when the last source has given all its samples; the
      shorter ones start over (reshuffled each pass) to keep their weights.

    ``epoch_length`` fixes the samples per epoch instead: ``"cycle"`` then cycles any
    source as often as needed; ``"all_exhausted"`` and ``"first_exhausted"`` cannot go
    past the samples they have (a longer ``epoch_length`` is cut, with a warning).

    Args:
        datasets: the sources, map-style (``__len__``; ``__getitem__`` to load samples
            through the mix). A ``range`` works where only indices are needed.
        weights: one positive weight per source (default: their lengths, which mixes
            them uniformly at random).
        policy: ``"all_exhausted"``, ``"first_exhausted"`` or ``"cycle"``.
        epoch_length: samples per epoch, across all ranks (default: the policy's).
        shuffle: shuffle each source (a new order every epoch and every pass); one bool
            for all or one per source (False: the source gives its samples in index order).
        seed: the seed of every epoch's order.

    Raises:
        ValueError: for a bad weight, policy, epoch length or ``shuffle`` list, or an empty
            source under ``"cycle"``.
    """

    def __init__(
        self,
        datasets: Sequence[Sized],
        weights: Sequence[float] | None = None,
        *,
        policy: str = "all_exhausted",
        epoch_length: int | None = None,
        shuffle: bool | Sequence[bool] = True,
        seed: int = 0,
    ) -> None:
        if not datasets:
            raise ValueError("WeightedMix needs at least one dataset")
        self.datasets = list(datasets)
        self.lengths = [len(d) for d in self.datasets]
        if weights is None:
            if sum(self.lengths) == 0:
                raise ValueError("WeightedMix: every dataset is empty and no weights were given")
            weights = [float(n) if n else 1.0 for n in self.lengths]
        self.weights = tuple(float(w) for w in weights)
        exact = check_weights(self.weights, len(self.datasets))
        if epoch_length is not None and (isinstance(epoch_length, bool) or epoch_length < 0):
            raise ValueError(f"epoch_length must be a non-negative int, got {epoch_length!r}")
        flags = [shuffle] * len(self.datasets) if isinstance(shuffle, bool) else list(shuffle)
        if len(flags) != len(self.datasets):
            raise ValueError(f"got {len(flags)} shuffle flags for {len(self.datasets)} datasets")
        self.shuffle = tuple(bool(f) for f in flags)
        self.policy = policy
        self.epoch_length = epoch_length
        self.seed = seed
        self.offsets = [0]
        for n in self.lengths:
            self.offsets.append(self.offsets[-1] + n)
        self._quotas, note = policy_quotas(self.lengths, exact, policy, epoch_length)
        if note is not None:
            warnings.warn(f"WeightedMix: {note}", stacklevel=2)
        one = policy != "all_exhausted"  # one phase: the counts are in proportion already
        self._phases = [self._quotas] if one else phases(self._quotas, exact)

    # -- the concatenation -----------------------------------------------------------------
    def __len__(self) -> int:
        """The size of the concatenation (an epoch's size is :meth:`samples_per_epoch`)."""
        return self.offsets[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, index in that source)`` of a concatenated index."""
        if not 0 <= index < len(self):
            raise IndexError(f"WeightedMix index {index} out of range for {len(self)} samples")
        source = bisect.bisect_right(self.offsets, index) - 1
        return source, index - self.offsets[source]

    def __getitem__(self, index: int) -> Any:
        source, local = self.locate(index)
        return self.datasets[source][local]  # type: ignore[index]

    # -- the plan ----------------------------------------------------------------------------
    def quotas(self) -> list[int]:
        """How many samples each source gives every epoch (a source over its length
        repeats, under ``"cycle"`` only)."""
        return list(self._quotas)

    def samples_per_epoch(self) -> int:
        """The length of every epoch's global order."""
        return sum(self._quotas)

    def order(self, epoch: int) -> torch.Tensor:
        """The global order of ``epoch``: concatenated indices (int64), the same in every
        process for the same mix, seed and epoch."""
        labels = self._labels(epoch)
        out = torch.empty(len(labels), dtype=torch.int64)
        for source, quota in enumerate(self._quotas):
            if quota:
                items = self._items(source, quota, epoch).to(torch.int64)
                out[labels == source] = items + self.offsets[source]
        return out

    def _labels(self, epoch: int) -> torch.Tensor:
        """Which source each position of the epoch draws from."""
        parts = []
        for number, counts in enumerate(self._phases):
            span = sum(counts)
            if sum(1 for c in counts if c) == 1:  # one source: nothing to shuffle
                parts.append(torch.full((span,), counts.index(span), dtype=torch.int64))
                continue
            ends = torch.tensor(counts, dtype=torch.int64).cumsum(0)
            gen = generator(self.seed, "mix", epoch, number)
            parts.append(torch.searchsorted(ends, _randperm(span, gen), right=True))
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def _items(self, source: int, quota: int, epoch: int) -> torch.Tensor:
        """The first ``quota`` samples of ``source`` in its own order (passes reshuffled)."""
        n = self.lengths[source]
        passes = []
        for number in range(-(-quota // n)):
            if self.shuffle[source]:
                gen = generator(self.seed, "source", source, epoch, number)
                passes.append(_randperm(n, gen))
            else:
                passes.append(torch.arange(n, dtype=torch.int64))
        return torch.cat(passes)[:quota]

    def fingerprint(self) -> str:
        """What identifies this mix's orders (lengths, weights, policy, epoch length,
        shuffle flags): a resume checks it, so that a state is never applied to a
        different mix."""
        parts: list[int | str] = [*self.lengths, *map(repr, self.weights), self.policy]
        parts += [repr(self.epoch_length), *map(int, self.shuffle)]
        return f"{derive_seed('mix', *parts):016x}"

    def __repr__(self) -> str:
        return (
            f"WeightedMix({len(self.datasets)} datasets, lengths={self.lengths}, "
            f"weights={list(self.weights)}, policy={self.policy!r}, quotas={self._quotas})"
        )


def _randperm(n: int, gen: torch.Generator) -> torch.Tensor:
    """``torch.randperm(n)``, drawn in int32 where it fits (a third faster, the same
    order for the same generator on every rank)."""
    dtype = torch.int32 if n < 2**31 else torch.int64
    return torch.randperm(n, generator=gen, dtype=dtype)
