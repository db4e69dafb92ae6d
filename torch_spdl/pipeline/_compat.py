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
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

from ._wire.channel import EOF

__all__ = [
    "cache_iterator",
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
    raises, naming the Python version it needs).

    Args:
        fn: as in ``iterate_in_subprocess``.
        args: as in ``iterate_in_subprocess``.
        kwargs: as in ``iterate_in_subprocess``.
    """
    _no_subinterpreters("iterate_in_subinterpreter")


def run_pipeline_in_subinterpreter(config: Any, *args: Any, **kwargs: Any) -> NoReturn:
    """SPDL's subinterpreter counterpart of ``run_pipeline_in_subprocess``: not available
    (it raises, naming the Python version it needs).

    Args:
        config: as in ``run_pipeline_in_subprocess``.
        args: as in ``run_pipeline_in_subprocess``.
        kwargs: as in ``run_pipeline_in_subprocess``.
    """
    _no_subinterpreters("run_pipeline_in_subinterpreter")


def cache_iterator(
    src: Iterable[T],
    num_caches: int,
    *,
    return_caches_after: int | None = None,
    stop_after: int | None = None,
    delete_src: bool = True,
) -> Iterator[T]:
    """Yield from ``src`` for a while, then replay the first items it gave, forever.

    A way to measure how fast training would run if data loading cost nothing: wrap the
    loader, and after ``return_caches_after`` items the loop gets the first ``num_caches``
    items again and again, at no cost.

    Args:
        src: the iterable to wrap (a data loader, a pipeline).
        num_caches: how many of its first items to keep.
        return_caches_after: how many items to take from ``src`` before replaying
            (default ``num_caches``; it must be at least ``num_caches``).
        stop_after: stop after this many items in all (default: never).
        delete_src: drop the reference to ``src`` once replaying starts, so its resources
            can be released.
    """
    if num_caches < 1:
        raise ValueError(f"num_caches must be positive, got {num_caches}")
    after = num_caches if return_caches_after is None else return_caches_after
    if after < num_caches:
        raise ValueError(
            f"return_caches_after ({after}) must be at least num_caches ({num_caches})"
        )
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"stop_after must be positive, got {stop_after}")
    return _cached(src, num_caches, after, stop_after, delete_src)


def _cached(
    src: Iterable[T], num_caches: int, after: int, stop_after: int | None, delete_src: bool
) -> Iterator[T]:
    caches: list[T] = []
    count = 0
    iterator = iter(src)
    for item in iterator:
        if len(caches) < num_caches:
            caches.append(item)
        yield item
        count += 1
        if count == stop_after:
            return
        if count >= after:
            break
    if delete_src:
        del src, iterator
    if not caches:
        return
    while True:
        for item in caches:
            yield item
            count += 1
            if count == stop_after:
                return
