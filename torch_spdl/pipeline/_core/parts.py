"""The parts a run owns besides its stages, shut down once as the run stops.

A pipeline's runtime owns the :class:`~.protocols.StoppablePart` objects registered with
it (``PipelineBuilder.add_stoppable``); so does the DataLoader's epoch where no pipeline
runs (``torch_spdl.data``'s ``IdleRun``). Both shut them down with :class:`OwnedParts`,
which imports nothing of the engine beyond the protocol, so that owning parts does not
load the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .protocols import StoppablePart

__all__ = ["OwnedParts"]

_LG = logging.getLogger("torch_spdl.pipeline")


class OwnedParts:
    """The parts registered with a run (:class:`StoppablePart`); true while some are
    still to be shut down.

    Args:
        parts: shut down in this order.
    """

    def __init__(self, parts: Sequence[StoppablePart]) -> None:
        self._parts = list(parts)

    def __bool__(self) -> bool:
        return bool(self._parts)

    def shutdown(self) -> None:
        """Shut down each part once, in the order registered; an error is logged, not
        raised: the rest of the run must still stop."""
        parts, self._parts = self._parts, []
        for part in parts:
            try:
                part.shutdown()
            except Exception:
                _LG.exception("shutting down %r failed", part)
