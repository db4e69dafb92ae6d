"""Exceptions the pipeline raises to its consumer.

SPDL code catches ``PipelineFailure`` as an ``ExceptionGroup`` of the stages' errors (so
``except*`` and ``.subgroup()`` work on it), while code written for torch_spdl reads
``failure.stage``, ``failure.num_failures`` and ``failure.__cause__``. The class keeps
both surfaces: it is a group of the original exceptions, each carrying a note that names
its stage (and item), and ``__cause__`` is the first of them.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence

__all__ = ["PipelineFailure", "describe_item"]

_REPR = reprlib.Repr()
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlist = 4
_REPR.maxtuple = 4
_REPR.maxdict = 4

_MESSAGE = "pipeline stages failed"


def describe_item(item: object) -> str:
    """A short, bounded repr of an item for error messages and logs."""
    try:
        return _REPR.repr(item)
    except Exception:  # a broken __repr__ must not hide the real error
        return f"<{type(item).__name__} object>"


class PipelineFailure(ExceptionGroup, RuntimeError):  # noqa: N818 (SPDL's name)
    """The pipeline failed: a stage went over its ``max_failures``, the source raised, or
    the engine broke.

    An ``ExceptionGroup`` of the original exceptions, one per failed stage, in the order
    they failed; each has a note naming its stage (and the item it failed on).
    ``stages`` names the stage of each exception, ``stage`` the first one,
    ``num_failures`` how many items that stage had failed on, and ``__cause__`` is the
    first exception (what a caller that re-raises "the real error" wants).
    ``subgroup()`` and ``split()`` return ``PipelineFailure`` objects too.

    Args:
        message: the group's message (SPDL's is ``"pipeline stages failed"``).
        exceptions: the stages' errors (at least one).
        stages: the stage of each error, in the same order.
        num_failures: how many items the first stage failed on.
    """

    def __new__(
        cls,
        message: str = _MESSAGE,
        exceptions: Sequence[Exception] = (),
        *,
        stages: Sequence[str] | None = None,
        num_failures: int = 0,
    ) -> PipelineFailure:
        return super().__new__(cls, message, list(exceptions))

    def __init__(
        self,
        message: str = _MESSAGE,
        exceptions: Sequence[Exception] = (),
        *,
        stages: Sequence[str] | None = None,
        num_failures: int = 0,
    ) -> None:
        super().__init__(message, list(exceptions))
        names = list(stages) if stages is not None else []
        names += ["?"] * (len(self.exceptions) - len(names))
        self.stages: tuple[str, ...] = tuple(names[: len(self.exceptions)])
        self.stage: str = self.stages[0]
        self.num_failures = num_failures
        self.__cause__ = self.exceptions[0]

    # split()/subgroup() call this with a subset of self.exceptions, all Exceptions. The
    # stub's derive is generic over the element type (any BaseException): a subclass that
    # always holds Exceptions and returns itself cannot match it.
    def derive(self, excs: Sequence[Exception]) -> PipelineFailure:  # type: ignore[override]
        by_id = {id(e): s for e, s in zip(self.exceptions, self.stages, strict=True)}
        stages = [by_id.get(id(e), "?") for e in excs]
        num = self.num_failures if stages and stages[0] == self.stage else 0
        return PipelineFailure(self.message, list(excs), stages=stages, num_failures=num)

    def __str__(self) -> str:
        parts = [
            f"stage {stage!r}: {type(exc).__name__}: {exc}"
            for stage, exc in zip(self.stages, self.exceptions, strict=True)
        ]
        return f"{self.message} ({'; '.join(parts)})"

    def __reduce__(self):  # keep the keyword arguments across processes
        return (
            _rebuild_failure,
            (self.message, list(self.exceptions), self.stages, self.num_failures),
        )


def _rebuild_failure(
    message: str, exceptions: list[Exception], stages: Sequence[str], num_failures: int
) -> PipelineFailure:
    return PipelineFailure(message, exceptions, stages=stages, num_failures=num_failures)
