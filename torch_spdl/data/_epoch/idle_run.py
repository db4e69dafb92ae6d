"""What an epoch holds where no pipeline runs: the owner of the epoch's waits.

An epoch always holds one object that owns every wait outside ``next()`` (the worker
processes that ``next()`` feeds and reads, with their arenas and pipes) and that the
epoch's end stops, as a pipeline shuts down the parts registered with it
(``PipelineBuilder.add_stoppable``). Where ``next()`` makes the batches itself (torch's
default shape with worker processes, or no workers at all), :class:`IdleRun` is that
owner. It is not a pipeline that never starts because declaring one loads the engine,
and a training script that swaps its ``DataLoader`` import would then carry the engine
(2 MiB in the training process, 30 ms of its start) for a pipeline that never runs.
"""

from __future__ import annotations

import weakref
from typing import Any

from ...pipeline import OwnedParts, StageStats, StoppablePart

__all__ = ["IdleRun"]


class IdleRun:
    """Owns ``parts`` and shuts each down once: at :meth:`stop`, or when collected.

    Args:
        parts: what the epoch's waits depend on, shut down in this order.
    """

    def __init__(self, *parts: StoppablePart) -> None:
        # The finalizer holds the parts, never this object: dropping the epoch without
        # stopping it still shuts them down.
        self._finalizer = weakref.finalize(self, OwnedParts(parts).shutdown)

    def stop(self, *, timeout: float | None = None) -> None:
        """Shut the parts down (nothing to join: no thread of its own). Idempotent."""
        self._finalizer()

    def get_stats(self) -> list[StageStats]:
        """No stage ran: nothing for ``worker_type="auto"`` to keep."""
        return []

    def get_item(self, *, timeout: float | None = None) -> Any:
        """Nothing comes from here: ``next()`` reads the batches itself."""
        raise EOFError
