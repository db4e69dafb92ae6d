"""aggregate() and disaggregate(): regroup the stream into lists and back."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ._channel import Channel
from ._hooks import TaskHook
from ._ops import OpKind
from ._thread_stage import ThreadStage

__all__ = ["AggregateStage", "DisaggregateStage"]


class AggregateStage(ThreadStage):
    """Collects ``size`` items into a list; the partial last list goes out at the end
    unless ``drop_last``."""

    one_task_per_item = True  # with hooks: adding an item is one task, batch or not

    def __init__(
        self,
        name: str,
        size: int,
        drop_last: bool,
        inbox: Channel[Any],
        outbox: Channel[Any],
        hooks: Sequence[TaskHook] = (),
    ) -> None:
        super().__init__(
            name, self._add, OpKind.GEN, inbox, outbox, workers=1, ordered=False, hooks=hooks
        )
        self.size = size
        self.drop_last = drop_last
        self._batch: list[Any] = []

    def _add(self, item: Any) -> Iterator[list[Any]]:
        self._batch.append(item)
        if len(self._batch) >= self.size:
            batch, self._batch = self._batch, []
            yield batch

    def flush(self) -> Iterable[Any]:
        batch, self._batch = self._batch, []
        return [batch] if batch and not self.drop_last else []


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
