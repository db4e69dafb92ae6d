"""How ``aggregate`` groups items: the :class:`Aggregator` interface (SPDL's) and
:class:`Collate`, the fixed-size grouping that ``aggregate(n)`` declares.

This is declaration-side code: a builder holds an aggregator (and each build copies it),
so it lives apart from the stage that runs it (``_stage_kinds/aggregate.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["Aggregator", "Collate"]


class Aggregator(ABC):
    """A custom ``aggregate``: decides itself when a group is complete (SPDL's interface).

    ``accumulate(item)`` is called for each item and returns the group to emit, or
    ``None`` to wait for more; ``flush()`` is called once at the end of the stream (unless
    ``drop_last``) and returns what is left, or ``None``. Each build of a pipeline works on
    its own copy of the aggregator, so a builder can be built more than once.
    """

    @abstractmethod
    def accumulate(self, item: Any) -> Any:
        """Take one item; return a group to emit, or None."""

    @abstractmethod
    def flush(self) -> Any:
        """The stream ended: return the last, partial group, or None."""


class Collate(Aggregator):
    """The default aggregator: lists of ``n`` items (``aggregate(n)``).

    Args:
        n: the size of each list (the last one may be shorter).
    """

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"aggregate needs a positive int, got {n!r}")
        self.n = n
        self._batch: list[Any] = []

    def accumulate(self, item: Any) -> list[Any] | None:
        self._batch.append(item)
        if len(self._batch) >= self.n:
            batch, self._batch = self._batch, []
            return batch
        return None

    def flush(self) -> list[Any] | None:
        batch, self._batch = self._batch, []
        return batch or None
