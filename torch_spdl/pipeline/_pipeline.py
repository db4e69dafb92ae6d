"""The running side: ``Pipeline`` starts, feeds the consumer, and stops its runtime."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from ._channel import EOF, Channel, ChannelAborted
from ._runtime import STOPPED, Runtime
from ._stats import StageStats, format_stats
from ._trace import PipelineTrace

__all__ = ["Pipeline"]

T = TypeVar("T")


class Pipeline(Generic[T]):
    """A built pipeline. Iterate it, or use :meth:`auto_stop` around the loop.

    Iterating a pipeline that is not started starts it, and the iteration stops it again
    when it ends, fails, is broken out of, or is dropped. A pipeline started explicitly
    (:meth:`start`, :meth:`auto_stop`) runs until :meth:`stop`. Dropping a running pipeline
    stops it too. Errors reach the consumer where they happen: a source error after the
    items made before it; a stage over its ``max_failures`` at once.
    """

    def __init__(self, runtime: Runtime, sink: Channel[Any], *, description: str) -> None:
        self._runtime = runtime
        self._sink = sink
        self._description = description
        self._finalizer = weakref.finalize(self, runtime.shutdown)

    def __repr__(self) -> str:
        return f"Pipeline({self._description})"

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the background threads (and event loop) of every stage."""
        self._runtime.start()

    def stop(self) -> None:
        """Stop every stage and join every thread; the pipeline is unusable afterwards."""
        self._runtime.shutdown()

    @contextlib.contextmanager
    def auto_stop(self) -> Iterator[Pipeline[T]]:
        """``start()`` on entry and ``stop()`` on exit, however the block exits."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    # -- consuming -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        return self.get_iterator()

    def get_iterator(self, *, timeout: float | None = None) -> Iterator[T]:
        """Iterate the results; raise ``TimeoutError`` if none arrives within ``timeout`` s."""
        return self._iterate(timeout)

    def _iterate(self, timeout: float | None) -> Iterator[T]:
        started_here = self._runtime.state == "new"
        if started_here:
            self.start()
        get = self._sink.get
        try:
            while True:  # the consumer's per-item path: inline, not shared with get_item
                try:
                    item = get(timeout)
                except ChannelAborted as aborted:
                    if aborted.reason is STOPPED:
                        return
                    raise aborted.reason from aborted.reason.__cause__  # type: ignore[misc]
                if item is EOF:
                    if self._sink.close_error is not None:
                        raise self._sink.close_error
                    return
                yield item
        finally:
            if started_here:
                self.stop()

    def get_item(self, *, timeout: float | None = None) -> T:
        """Return the next result; ``EOFError`` at the end, ``TimeoutError`` after ``timeout``.

        Starts the pipeline if needed; it then runs until :meth:`stop`.
        """
        if self._runtime.state == "new":
            self.start()
        try:
            item = self._sink.get(timeout)
        except ChannelAborted as aborted:
            if aborted.reason is STOPPED:
                raise EOFError("the pipeline was stopped") from None
            raise aborted.reason from aborted.reason.__cause__  # type: ignore[misc]
        if item is EOF:
            if self._sink.close_error is not None:
                raise self._sink.close_error
            raise EOFError("the pipeline reached the end of its source")
        return item

    # -- introspection -------------------------------------------------------------------
    def get_stats(self) -> list[StageStats]:
        """A snapshot of every stage's counters (live while running, final after)."""
        return self._runtime.stats()

    def format_stats(self) -> str:
        """The stage table that ``report_stats_interval`` logs."""
        return format_stats(self.get_stats())

    def trace(self) -> PipelineTrace:
        """What a pipeline built with ``trace=True`` recorded so far (live while running).

        Raises ``RuntimeError`` for a pipeline built without tracing.
        """
        return self._runtime.trace()

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the trace as Chrome trace JSON (load it in ui.perfetto.dev)."""
        self.trace().export_chrome_trace(path)

    def plot_trace(self, path: str | os.PathLike[str], *, bin_seconds: float | None = None) -> None:
        """Write a PNG of per-stage throughput and queue occupancy over time (matplotlib)."""
        self.trace().plot(path, bin_seconds=bin_seconds)

    def _stop_as_source(self) -> None:
        """Used when this pipeline feeds another one that is stopping."""
        self.stop()
