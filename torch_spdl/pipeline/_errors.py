"""Exceptions the pipeline raises to its consumer."""

from __future__ import annotations

import reprlib

__all__ = ["PipelineFailure", "describe_item"]

_REPR = reprlib.Repr()
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlist = 4
_REPR.maxtuple = 4
_REPR.maxdict = 4


def describe_item(item: object) -> str:
    """A short, bounded repr of an item for error messages and logs."""
    try:
        return _REPR.repr(item)
    except Exception:  # a broken __repr__ must not hide the real error
        return f"<{type(item).__name__} object>"


class PipelineFailure(RuntimeError):
    """A stage failed more often than its ``max_failures`` allows, or the engine broke.

    ``stage`` names the stage, ``num_failures`` counts its failed items and ``__cause__``
    is the last original exception.
    """

    def __init__(self, message: str, *, stage: str, num_failures: int = 0) -> None:
        super().__init__(message)
        self.stage = stage
        self.num_failures = num_failures

    def __reduce__(self):  # keep the keyword arguments across processes
        return (_rebuild_failure, (str(self), self.stage, self.num_failures))


def _rebuild_failure(message: str, stage: str, num_failures: int) -> PipelineFailure:
    return PipelineFailure(message, stage=stage, num_failures=num_failures)
