"""The running side: ``Pipeline`` starts, feeds the consumer, and stops its runtime."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, Generic, Literal, NoReturn, TypeVar

from .._core.errors import PipelineFailure
from .._core.stats import StageStats, format_stats
from .._wire.channel import EOF, Channel, ChannelAborted
from .runtime import STOPPED, Runtime
from .trace_record import PipelineTrace

__all__ = ["Pipeline"]

T = TypeVar("T")


class Pipeline(Generic[T]):
    """A built pipeline. Iterate it, or use :meth:`auto_stop` around the loop.

    Iterating a pipeline that is not started starts it, and the iteration stops it again
    when it ends, fails, is broken out of, or is dropped. A pipeline started explicitly
    (:meth:`start`, :meth:`auto_stop`, :meth:`get_item`) runs until :meth:`stop`. Dropping
    a running pipeline stops it too.

    When the pipeline fails (a stage over its ``max_failures``, the source raising, the
    engine breaking) the consumer still receives every item already made, then:

    - started by iterating it (a plain ``for`` loop, no :meth:`stop` to come): the loop
      raises the :class:`PipelineFailure` at the end of the stream;
    - started explicitly (SPDL's way): iteration ends quietly, :meth:`get_item` raises
      ``EOFError``, and :meth:`stop` (or leaving :meth:`auto_stop`) raises the
      ``PipelineFailure``, again on every later call.
    """

    def __init__(
        self,
        runtime: Runtime,
        sink: Channel[Any],
        *,
        description: str,
        renew: Callable[[], tuple[Runtime, Channel[Any]]] | None = None,
    ) -> None:
        """``renew``, for a continuous (multi-epoch) pipeline: makes the next epoch's run
        (its runtime and sink) when an epoch's stream has ended and the consumer asks
        again (``add_source(continuous=True)``)."""
        self._runtime = runtime
        self._sink = sink
        self._description = description
        self._finalizer = weakref.finalize(self, runtime.shutdown)
        self._explicit = False  # started by start()/auto_stop()/get_item: stop() reports
        self._renew = renew
        self._epoch_done = False  # continuous: the current epoch's stream has ended
        # Taken from the sink in bulk and not yet handed out (module notes of _iterate):
        # still the sink's, for iteration and get_item alike.
        self._held: deque[Any] = deque()
        self._kept: deque[Any] = deque()  # what get_item() still hands out after stop()

    def __repr__(self) -> str:
        return f"Pipeline({self._description})"

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, *, timeout: float | None = None) -> None:
        """Start the background threads (and event loop) of every stage.

        Args:
            timeout: accepted for SPDL compatibility; starting does not wait for anything.
        """
        self._explicit = True
        self._runtime.start()

    def stop(self, *, timeout: float | None = None) -> None:
        """Stop every stage and join every thread; the pipeline is unusable afterwards.

        Stopping a pipeline that never started does nothing (it can still be started
        afterwards), unless parts were registered with it
        (:meth:`PipelineBuilder.add_stoppable`): they may be running already, so they are
        shut down, and the pipeline with them. Stopping it again is a no-op. For a pipeline started
        explicitly, raises the :class:`PipelineFailure` if it failed, on every call.

        Args:
            timeout: the most seconds to wait for the threads to join (default 0.5; a
                thread still inside an op is left to finish as a daemon, named in a
                warning).
        """
        if self._runtime.state == "new" and not self._runtime.parts:
            return  # never started: nothing to stop, and it can still be started (SPDL)
        # For get_item() after stop(): what the sink held, the pipeline's alone from here
        # (left in the sink, which a failed run's stages hold in reference cycles, a
        # dropped pipeline's batches stayed until the cycle collector ran).
        self._runtime.shutdown(timeout, keep_sink=self._kept if self._explicit else None)
        # Taken from the sink and not handed out: kept ahead of what the sink held. One
        # popleft at a time: a loop on another thread may be taking from it meanwhile.
        taken: list[Any] = []
        while self._held:
            try:
                taken.append(self._held.popleft())
            except IndexError:
                break
        if self._explicit:
            self._kept.extendleft(reversed(taken))
            # At most what the sink holds, oldest first, as SPDL's: an item a stage handed
            # on past the sink's size (bulk hand-offs) is still that stage's, and a stop
            # drops what the stages hold.
            size = self._runtime.channels[-1].capacity  # 0: unbounded
            while size and len(self._kept) > size:
                self._kept.pop()
        # Stopped: nothing is left for the finalizer to do, and kept, it would keep the
        # runtime, its failure, the failure's traceback and every frame and batch that
        # holds alive (the finalizer registry is never collected).
        self._finalizer.detach()
        if self._explicit and self._runtime.failure is not None:
            _raise(self._runtime.failure)

    @contextlib.contextmanager
    def auto_stop(self, *, timeout: float | None = None) -> Iterator[Pipeline[T]]:
        """``start()`` on entry and ``stop()`` on exit, however the block exits.

        Leaving the block raises the :class:`PipelineFailure` if the pipeline failed,
        unless the block itself is raising (that exception goes on, the failure stays
        readable from :meth:`stop`).

        Args:
            timeout: passed to :meth:`stop`.
        """
        self.start()
        try:
            yield self
        except BaseException:
            self._runtime.shutdown(timeout)
            raise
        self.stop(timeout=timeout)

    # -- consuming -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        return self.get_iterator()

    def get_iterator(self, *, timeout: float | None = None) -> Iterator[T]:
        """Iterate the results.

        Args:
            timeout: the most seconds to wait for each item (``TimeoutError``; default:
                wait as long as it takes).
        """
        return _iterate(self, timeout)

    def get_item(self, *, timeout: float | None = None) -> T:
        """Return the next result; ``EOFError`` at the end, ``TimeoutError`` after ``timeout``.

        Starts the pipeline if needed; it then runs until :meth:`stop`. After :meth:`stop`
        it returns what the sink still held, then raises ``EOFError`` (iteration, in
        contrast, ends at :meth:`stop`). Once a failed
        pipeline has delivered what it made, raises ``EOFError`` (chained to the failure);
        :meth:`stop` raises the failure itself.

        Args:
            timeout: the most seconds to wait for an item (default: no limit).
        """
        if self._runtime.state == "new":
            self.start()
        elif self._epoch_done and self._runtime.state == "running":
            _next_epoch(self)
        elif self._held:
            return self._held.popleft()  # taken from the sink in bulk by an iteration
        elif self._runtime.state == "stopped" and self._kept:
            return self._kept.popleft()  # what was buffered when stop() came
        try:
            item = self._sink.get(timeout)
        except ChannelAborted as aborted:
            end = _ending(self, aborted)
        else:
            if item is not EOF:
                return item
            end = _ending(self, None)
        if end == "failed":
            raise EOFError("the pipeline failed: stop() raises the failure") from (
                self._runtime.failure
            )
        raise EOFError(_END_OF_ITEMS[end]) from None

    # -- introspection -------------------------------------------------------------------
    def get_stats(self) -> list[StageStats]:
        """A snapshot of every stage's counters (live while running, final after)."""
        return [node.stats() for node in self._runtime.nodes]

    def format_stats(self) -> str:
        """The stage table that ``report_stats_interval`` logs."""
        return format_stats(self.get_stats())

    def trace(self) -> PipelineTrace:
        """What a pipeline built with ``trace=True`` recorded so far (live while running).

        Raises ``RuntimeError`` for a pipeline built without tracing.
        """
        return self._runtime.trace()

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the trace as Chrome trace JSON (load it in ui.perfetto.dev).

        Args:
            path: the file to write.
        """
        self.trace().export_chrome_trace(path)

    def plot_trace(self, path: str | os.PathLike[str], *, bin_seconds: float | None = None) -> None:
        """Write a PNG of per-stage throughput and queue occupancy over time (matplotlib).

        Args:
            path: the file to write.
            bin_seconds: the width of a throughput bin (default: a hundredth of the run,
                at least 10 ms).
        """
        self.trace().plot(path, bin_seconds=bin_seconds)

    @property
    def _impl(self) -> SimpleNamespace:
        """SPDL's own tests check a pipeline's background run through its internals
        (``pipeline._impl._event_loop.is_started()`` / ``.is_task_completed()``); this view
        of the current run answers them. It holds the run, not the pipeline, so the
        pipeline can still be collected (and its run stopped) while the view is kept."""
        return SimpleNamespace(_event_loop=_RunView(self._runtime))

    def stop_source(self) -> None:
        """Stop, without raising: what a pipeline that this one feeds calls as it stops
        (:class:`StoppableSource`)."""
        self._runtime.shutdown()


# -- the consumer's side of the stream, shared by iteration and get_item -----------------
_Ending = Literal["stopped", "failed", "epoch", "end"]
_END_OF_ITEMS = {
    "stopped": "the pipeline was stopped",
    "epoch": "the epoch ended (the next call starts the next one)",
    "end": "the pipeline reached the end of its source",
}


def _ending(pipeline: Pipeline[Any], aborted: ChannelAborted | None) -> _Ending:
    """Why the sink gave no item (``aborted``, or ``EOF`` when None): stopped, failed, the
    end of a continuous pipeline's epoch (recorded: the next request starts the next one)
    or the end of the stream."""
    if aborted is not None:
        if aborted.reason is STOPPED and pipeline._runtime.failure is None:
            return "stopped"
        return "failed"
    if pipeline._sink.close_error is not None:
        return "failed"
    if pipeline._renew is not None:
        pipeline._epoch_done = True
        return "epoch"
    return "end"


def _iterate(pipeline: Pipeline[T], timeout: float | None) -> Iterator[T]:
    """The consumer's loop: the whole stream, or one epoch of a continuous pipeline (which
    then runs on until ``stop()``). A pipeline this loop started is stopped when it ends;
    a failure is raised at the end of the stream unless ``stop()`` is to report it."""
    runtime, continuous = pipeline._runtime, pipeline._renew is not None
    started_here = False
    if runtime.state == "new":  # not explicit: a failure is raised at the stream's end
        runtime.start()
        started_here = not continuous
    elif pipeline._epoch_done and runtime.state == "running":
        _next_epoch(pipeline)
    elif continuous and runtime.state == "stopped":
        return
    sink, held = pipeline._sink, pipeline._held
    # Ready items are taken in bulk (the channel's notes), up to half the sink, so a sink
    # of a few batches still hands them over one at a time; what was taken waits in
    # ``held``, which get_item() and the next iteration read first, and stop() keeps.
    limit = max(1, sink.capacity // 2) if sink.bulk else 1
    get = sink.get_many if limit > 1 else None
    try:
        while True:  # the consumer's per-item path: inline, not shared with get_item
            while held:
                yield held.popleft()
            try:
                items = get(limit, timeout) if get is not None else [sink.get(timeout)]
            except ChannelAborted as aborted:
                end = _ending(pipeline, aborted)
                break
            if items is EOF or items[0] is EOF:
                end = _ending(pipeline, None)
                break
            held.extend(items)
        if end == "failed" and (started_here or not pipeline._explicit):
            _raise(pipeline._runtime.failure)
    finally:
        if started_here:
            pipeline._runtime.shutdown()
            held.clear()  # the sink's items went with the run this loop stopped


def _next_epoch(pipeline: Pipeline[Any]) -> None:
    """The consumer asks for more after an epoch ended: run the next one."""
    assert pipeline._renew is not None
    pipeline._runtime.shutdown()
    pipeline._finalizer.detach()
    runtime, pipeline._sink = pipeline._renew()
    pipeline._runtime = runtime
    pipeline._finalizer = weakref.finalize(pipeline, runtime.shutdown)
    pipeline._epoch_done = False
    runtime.start()


class _RunView:
    """Whether a run started, and whether it has finished (see ``Pipeline._impl``)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def is_started(self) -> bool:
        return self._runtime.state != "new"

    def is_task_completed(self) -> bool:
        return self._runtime.state == "stopped"


def _raise(failure: PipelineFailure | None) -> NoReturn:
    """Raise ``failure`` from a frame that forgets it: a frame that holds the exception it
    raises makes a cycle through the traceback (and the caller's ``self``, the pipeline),
    freed only by the cycle collector."""
    assert failure is not None
    try:
        raise failure
    finally:
        del failure
