"""Background tasks: coroutines that live as long as a pipeline runs (SPDL's interface).

A monitor, a metrics exporter or a heartbeat needs the pipeline's lifetime, not an item:
``build(background_tasks=[factory, ...])`` makes one :class:`BackgroundTask` per factory
when the pipeline starts, runs its ``run()`` on the pipeline's event loop, and cancels it
when the pipeline stops. A background task that fails is logged and does not fail the
pipeline: it is not part of the data path.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable

__all__ = ["BackgroundTask", "BackgroundTaskFactory", "run_background"]

_LG = logging.getLogger("torch_spdl.pipeline")


class BackgroundTask(ABC):
    """Subclass it and implement :meth:`run`; pass the class (or any factory returning an
    instance) in ``build(background_tasks=[...])``."""

    @abstractmethod
    async def run(self) -> None:
        """Runs on the pipeline's event loop from start until it is cancelled at stop."""


BackgroundTaskFactory = Callable[[], BackgroundTask]


async def run_background(factory: BackgroundTaskFactory) -> None:
    """Make and run one background task; log (do not raise) its failure."""
    try:
        task = factory()
        await task.run()
    except Exception as exc:
        _LG.error(
            "background task %r failed (the pipeline goes on): %s: %s",
            factory,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
