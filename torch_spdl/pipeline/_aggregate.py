"""aggregate() and disaggregate(): regroup the stream into lists (or custom groups) and back.

Grouping is an :class:`Aggregator` (SPDL's interface), so ``aggregate(n)`` and a custom
grouping run the same stage; ``aggregate(n)`` is :class:`Collate` ``(n)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ._channel import Channel
from ._hooks import TaskHook
from ._ops import OpKind
from ._thread_stage import ThreadStage

__all__ = ["AggregateStage", "Aggregator", "Collate", "DisaggregateStage"]


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


class AggregateStage(ThreadStage):
    """Feeds every item to an :class:`Aggregator` and emits the groups it returns; at the
    end of the stream, what ``flush()`` returns too, unless ``drop_last``."""

    one_task_per_item = True  # with hooks: adding an item is one task, group or not

    def __init__(
        self,
        name: str,
        aggregator: Aggregator,
        drop_last: bool,
        inbox: Channel[Any],
        outbox: Channel[Any],
        hooks: Sequence[TaskHook] = (),
    ) -> None:
        super().__init__(
            name, self._add, OpKind.GEN, inbox, outbox, workers=1, ordered=False, hooks=hooks
        )
        self.aggregator = aggregator
        self.drop_last = drop_last

    def _add(self, item: Any) -> Iterator[Any]:
        out = self.aggregator.accumulate(item)
        if out is not None:
            yield out

    def flush(self) -> Iterable[Any]:
        if self.drop_last:
            return []
        out = self.aggregator.flush()
        return [] if out is None else [out]


def _split(items: Iterable[Any]) -> Iterator[Any]:
    yield from items


class DisaggregateStage(ThreadStage):
    """Emits each element of every incoming iterable as its own item."""

    def __init__(
        self,
        name: str,
        inbox: Channel[Any],
        outbox: Channel[Any],
        hooks: Sequence[TaskHook] = (),
    ) -> None:
        super().__init__(
            name, _split, OpKind.GEN, inbox, outbox, workers=1, ordered=False, hooks=hooks
        )
