"""Round-robin across workers, as torch's loader takes its workers' batches.

torch takes one batch from each worker in turn, and a worker whose iterator has ended
leaves the turn, which passes to the next worker. The DataLoader's iterable datasets keep
that order whether their workers are threads or processes, and both follow this one rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["RoundRobin"]

K = TypeVar("K")


class RoundRobin(Generic[K]):
    """Whose turn it is among ``keys``, starting at the ``start``-th."""

    def __init__(self, keys: Iterable[K], start: int = 0) -> None:
        self.active = list(keys)
        self._turn = start

    def __bool__(self) -> bool:
        return bool(self.active)

    def current(self) -> K:
        """The worker whose turn it is (some worker must be active)."""
        self._turn %= len(self.active)
        return self.active[self._turn]

    def passed(self) -> None:
        """The current worker had its turn: the next one's comes."""
        self._turn += 1

    def leave(self, key: K) -> None:
        """``key`` has no more (its turn goes to the worker after it)."""
        self.active.remove(key)
