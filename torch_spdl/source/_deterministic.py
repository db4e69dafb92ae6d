"""``DistributedDeterministicSampler``: this rank's indices, in the same order every time.

For evaluation, where every rank must see its share of the data once and in a stable
order: rank ``r`` of ``w`` takes ``r, r + w, r + 2w, ...`` (SPDL's contract), so together
the ranks cover ``range(n)`` exactly once, and no shuffling state is involved.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._ranks import resolve_rank_and_world_size

__all__ = ["DistributedDeterministicSampler"]


class DistributedDeterministicSampler:
    """Yields ``range(rank, n, world_size)``, identical on every iteration.

    Args:
        n: the size of the dataset.
        rank: this process's rank (default: detected from ``torch.distributed``).
        world_size: the number of ranks (default: detected).
    """

    def __init__(self, n: int, /, *, rank: int | None = None, world_size: int | None = None):
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        self.n = n
        self.rank, self.world_size = resolve_rank_and_world_size(rank, world_size)

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.world_size))
