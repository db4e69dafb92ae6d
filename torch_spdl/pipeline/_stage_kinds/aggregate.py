"""aggregate() and disaggregate(): regroup the stream into lists (or custom groups) and back.

Grouping is an :class:`Aggregator` (SPDL's interface), so ``aggregate(n)`` and a custom
grouping run the same stage; ``aggregate(n)`` is :class:`Collate` ``(n)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .._declare.failures import FailureLimit
from .._declare.grouping import Aggregator
from .._declare.ops import OpKind
from .._plugins.hooks import TaskHook, hooked_sync
from .._wire.channel import Channel
from .thread_stage import ThreadStage

__all__ = ["AggregateStage", "DisaggregateStage"]


class AggregateStage(ThreadStage):
    """Feeds every item to an :class:`Aggregator` and emits the groups it returns; at the
    end of the stream, what ``flush()`` returns too, unless ``drop_last``."""

    one_task_per_item = True  # with hooks: adding an item is one task, group or not

    def __init__(
        self,
        name: str,
        aggregator: Aggregator,
        inbox: Channel[Any],
        outbox: Channel[Any],
        hooks: Sequence[TaskHook] = (),
        *,
        drop_last: bool = False,
        budget: FailureLimit | None = None,
    ) -> None:
        # An item whose accumulate() raises is a failure like any op's: logged, counted
        # against the build's max_failures, dropped.
        super().__init__(
            name,
            self._add,
            OpKind.GEN,
            inbox,
            outbox,
            workers=1,
            ordered=False,
            hooks=hooks,
            budget=budget,
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
        if not self.hooks:
            out = self.aggregator.flush()
        else:  # as in SPDL, the end-of-stream flush is one more task for the task hooks
            flush, close = hooked_sync(
                lambda _: self.aggregator.flush(), self.hooks, generator=False
            )
            try:
                out = flush(None)
            finally:
                close()
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
        *,
        budget: FailureLimit | None = None,
    ) -> None:
        super().__init__(
            name,
            _split,
            OpKind.GEN,
            inbox,
            outbox,
            workers=1,
            ordered=False,
            hooks=hooks,
            budget=budget,
        )
