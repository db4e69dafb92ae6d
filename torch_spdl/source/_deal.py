"""Where each position of an epoch's global order goes: what is left of it, which rank
takes it, which worker of that rank.

Three small pieces, each a pure function of ints, shared by the samplers and the
iterable mix, and by the resume that merges their states (``_elastic``):

- :class:`Delivered`: the positions of the global order already delivered, kept as a
  *watermark* (every position below it) and the few *extra* positions past it (delivered
  out of order, or by a rank that ran ahead). What is left, the *remainder*, keeps the
  global order; :meth:`Delivered.positions` maps a remainder index to its position.
- :class:`Split`: the remainder dealt to ``world_size`` ranks, rank ``r`` taking every
  ``world_size``-th index from ``r`` (as ``DistributedSampler`` does), evened out like it
  (padded by starting over, or trimmed with ``drop_last``) or not (``even_out=False``).
- :class:`Blocks`: a rank's share dealt to its workers in blocks of ``block`` indices,
  worker ``k`` of ``K`` taking blocks ``k, k + K, ...``: with ``block`` the loader's batch
  size, a loader that takes the workers' batches in turn (torch's order) delivers a
  prefix of the rank's share.

Everything here is computed from counts, never by listing the epoch: a resume point is a
watermark and a short list, however long the epoch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Blocks", "Delivered", "Split"]


@dataclass(frozen=True)
class Delivered:
    """Positions ``[0, watermark)`` and ``extra`` of an epoch of ``length`` delivered."""

    length: int
    watermark: int = 0
    extra: tuple[int, ...] = ()
    _gaps: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.watermark <= self.length:
            raise ValueError(f"watermark {self.watermark} outside an epoch of {self.length}")
        if list(self.extra) != sorted(set(self.extra)) or any(
            not self.watermark < e < self.length for e in self.extra
        ):
            raise ValueError("extra positions must be distinct, sorted, past the watermark")
        # remainder indices at which each extra position would sit: a bisect finds how
        # many extras come before a remainder index
        self._gaps.extend(e - self.watermark - j for j, e in enumerate(self.extra))

    @classmethod
    def from_positions(cls, length: int, watermark: int, extra: Iterable[int]) -> Delivered:
        """Normalised: the watermark raised past every extra position that reaches it."""
        rest = {e for e in extra if e >= watermark}
        while watermark in rest:
            rest.discard(watermark)
            watermark += 1
        return cls(length, watermark, tuple(sorted(rest)))

    @property
    def remaining(self) -> int:
        """How many positions are not delivered yet."""
        return self.length - self.watermark - len(self.extra)

    def position(self, index: int) -> int:
        """The global position of remainder index ``index``."""
        return self.watermark + index + bisect.bisect_right(self._gaps, index)

    def positions(self, indices: torch.Tensor) -> torch.Tensor:
        """:meth:`position` of each of ``indices`` (int64)."""
        if not self.extra:
            return indices + self.watermark
        gaps = torch.tensor(self._gaps, dtype=torch.int64)
        return indices + self.watermark + torch.searchsorted(gaps, indices, right=True)

    def as_dict(self) -> dict[str, Any]:
        return {"length": self.length, "watermark": self.watermark, "extra": list(self.extra)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Delivered:
        return cls(int(state["length"]), int(state["watermark"]), tuple(state["extra"]))


@dataclass(frozen=True)
class Split:
    """A remainder dealt to ``world_size`` ranks (see the module's notes)."""

    world_size: int
    even_out: bool = True
    drop_last: bool = False

    def share_length(self, remaining: int, rank: int) -> int:
        """How many indices rank ``rank`` takes."""
        if not self.even_out:
            return len(range(rank, remaining, self.world_size))
        if self.drop_last:
            return remaining // self.world_size
        return -(-remaining // self.world_size)

    def dealt(self, remaining: int) -> int:
        """How many distinct remainder indices some rank takes (``drop_last`` leaves the
        last ``remaining % world_size`` to no rank)."""
        if self.even_out and self.drop_last:
            return remaining - remaining % self.world_size
        return remaining

    def index(self, remaining: int, rank: int, j: int) -> int:
        """The remainder index of rank ``rank``'s ``j``-th (past the end: padding, which
        starts the remainder over)."""
        i = rank + self.world_size * j
        return i % remaining if i >= remaining else i

    def indices(self, remaining: int, rank: int) -> torch.Tensor:
        """Every remainder index rank ``rank`` takes, in its order."""
        n = self.share_length(remaining, rank)
        raw = torch.arange(n, dtype=torch.int64) * self.world_size + rank
        return raw % remaining if remaining and n and raw[-1] >= remaining else raw

    def as_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "even_out": self.even_out,
                "drop_last": self.drop_last}  # fmt: skip


@dataclass(frozen=True)
class Blocks:
    """Worker ``worker`` of ``num_workers``: blocks ``worker, worker + num_workers, ...``
    of ``block`` indices each of its rank's share."""

    worker: int = 0
    num_workers: int = 1
    block: int = 1

    def __post_init__(self) -> None:
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers or self.block < 1:
            raise ValueError(
                f"invalid worker {self.worker} of {self.num_workers} (block {self.block})"
            )

    def length(self, share: int) -> int:
        """How many of a share of ``share`` indices this worker takes."""
        full, rest = divmod(share, self.block)
        mine = len(range(self.worker, full, self.num_workers)) * self.block
        return mine + (rest if full % self.num_workers == self.worker else 0)

    def share_index(self, s: int) -> int:
        """The share index of this worker's ``s``-th."""
        b, offset = divmod(s, self.block)
        return (self.worker + self.num_workers * b) * self.block + offset

    def share_indices(self, share: int) -> torch.Tensor:
        """Every share index this worker takes, in its order."""
        s = torch.arange(self.length(share), dtype=torch.int64)
        b, offset = s // self.block, s % self.block
        return (self.worker + self.num_workers * b) * self.block + offset

    def as_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "num_workers": self.num_workers, "block": self.block}
