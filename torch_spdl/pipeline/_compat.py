"""Small names SPDL code imports from ``spdl.pipeline`` that are not part of the engine.

``is_eof`` / ``is_epoch_end`` recognise SPDL's stream markers. ``create_task`` is SPDL's
helper to start a task whose failure is logged rather than lost (an ``asyncio`` task that
nobody awaits drops its exception silently). The subinterpreter
entry points exist so that importing them works; running a pipeline in a subinterpreter
needs Python 3.14 and is not available here, which they say when called.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

from ._channel import EOF

__all__ = [
    "create_task",
    "is_eof",
    "is_epoch_end",
    "iterate_in_subinterpreter",
    "run_pipeline_in_subinterpreter",
]

_LG = logging.getLogger("torch_spdl.pipeline")

T = TypeVar("T")


def create_task(
    coro: Coroutine[Any, Any, T], name: str | None = None, log_cancelled: bool = False
) -> asyncio.Task[T]:
    """``asyncio.create_task`` that logs the task's exception when it fails.

    Args:
        coro: the coroutine to run on the running event loop.
        name: the task's name (shown in the log).
        log_cancelled: also log (as a warning) when the task is cancelled.
    """
    task = asyncio.create_task(coro, name=name)

    def report(t: asyncio.Task[T]) -> None:
        if t.cancelled():
            if log_cancelled:
                _LG.warning("task %r was cancelled", t.get_name())
            return
        exc = t.exception()
        if exc is not None:
            _LG.error("task %r failed: %s: %s", t.get_name(), type(exc).__name__, exc, exc_info=exc)

    task.add_done_callback(report)
    return task


class _EpochEnd:
    """SPDL's epoch-boundary sentinel (see :func:`is_epoch_end`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EPOCH_END"


EPOCH_END: Any = _EpochEnd()


def is_eof(item: Any) -> bool:
    """True for the end-of-stream marker: what a custom ``Merge`` op reads from an input
    queue once that pipeline has ended.

    Args:
        item: what was read from a queue.
    """
    return item is EOF


def is_epoch_end(item: Any) -> bool:
    """True for SPDL's epoch-boundary marker.

    A continuous pipeline here runs each epoch as its own run, so the marker never
    reaches an op or an aggregator (``aggregate`` calls ``flush()`` at every boundary
    instead, which is what SPDL's ``Collate`` does on seeing it); the function exists for
    code that tests for it.

    Args:
        item: an item of the stream.
    """
    return item is EPOCH_END


def _no_subinterpreters(name: str) -> NoReturn:
    if sys.version_info < (3, 14):
        raise RuntimeError(
            f"{name} needs Python 3.14 or later (subinterpreters, PEP 734); this is Python "
            f"{sys.version_info.major}.{sys.version_info.minor}. Use run_pipeline_in_subprocess "
            "or iterate_in_subprocess instead"
        )
    raise NotImplementedError(
        f"{name}: torch_spdl does not run pipelines in subinterpreters yet; use "
        "run_pipeline_in_subprocess or iterate_in_subprocess instead"
    )


def iterate_in_subinterpreter(fn: Any, *args: Any, **kwargs: Any) -> NoReturn:
    """SPDL's subinterpreter counterpart of ``iterate_in_subprocess``: not available (it
    raises, naming the Python version it needs)."""
    _no_subinterpreters("iterate_in_subinterpreter")


def run_pipeline_in_subinterpreter(config: Any, *args: Any, **kwargs: Any) -> NoReturn:
    """SPDL's subinterpreter counterpart of ``run_pipeline_in_subprocess``: not available
    (it raises, naming the Python version it needs)."""
    _no_subinterpreters("run_pipeline_in_subinterpreter")
