"""Small names SPDL code imports from ``spdl.pipeline`` that are not part of the engine.

``create_task`` is SPDL's helper to start a task whose failure is logged rather than lost
(an ``asyncio`` task that nobody awaits drops its exception silently). The subinterpreter
entry points exist so that importing them works; running a pipeline in a subinterpreter
needs Python 3.14 and is not available here, which they say when called.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

__all__ = ["create_task", "iterate_in_subinterpreter", "run_pipeline_in_subinterpreter"]

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
