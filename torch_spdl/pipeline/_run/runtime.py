"""The owner of every thread and task of one running pipeline.

Workers never outlive their runtime: ``shutdown`` aborts every channel (which wakes every
worker waiting on one), shuts down the parts registered with the pipeline
(:class:`~.._core.protocols.StoppablePart`: what a worker may wait on outside the
channels), cancels the event loop's tasks, and joins every thread it started.
The event loop's default executor (where ``asyncio.to_thread`` runs, as ``torch_spdl.io``'s
async functions do) is one the runtime makes and shuts down, waiting for its threads, when
the loop ends: ``loop.close()`` alone would leave them running.
The runtime holds no reference to the user-facing ``Pipeline``, so a pipeline that is
dropped while running can be collected, and its finalizer shuts the runtime down.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._autotune import AutotuneConfig, Autotuner
from .._core.errors import PipelineFailure
from .._core.parts import OwnedParts
from .._core.protocols import StoppablePart, SupervisedStage
from .._core.stats import StatsReporter
from .._plugins.background import BackgroundTaskFactory, run_background
from .._wire.channel import Channel
from .trace_record import PipelineTrace
from .tracer import Tracer

__all__ = ["Runtime", "STOPPED"]

_LG = logging.getLogger("torch_spdl.pipeline")


class _Stopped(Exception):
    """The reason given to channels when the pipeline is stopped on purpose."""


# How long stop() waits for the threads. Stopping aborts every channel, so a thread that
# waits on one ends at once; one that does not is inside an op (a read that hangs, a long
# decode), which nothing can interrupt. It is left to finish as a daemon, named in a
# warning, rather than delaying the caller: a timeout, a break or an error must reach the
# training loop promptly (the DataLoader waits 0.1 s).
_JOIN_S = 0.5


STOPPED = _Stopped("the pipeline was stopped")


class Runtime:
    """Starts, fails and stops the workers of the given nodes."""

    def __init__(
        self,
        nodes: Sequence[SupervisedStage],
        channels: Sequence[Channel[Any]],
        *,
        report_stats_interval: float = -1,
        join_timeout: float = _JOIN_S,
        autotune: AutotuneConfig | None = None,
        trace: bool = False,
        background_tasks: Sequence[BackgroundTaskFactory] = (),
        parts: Sequence[StoppablePart] = (),
    ) -> None:
        self.nodes = list(nodes)
        self.parts = OwnedParts(parts)
        self._background = list(background_tasks)
        self.channels = list(channels)
        self._threads: list[threading.Thread] = []
        self._task_factories: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[Any] | None = None
        # set once every background task has taken its first step (see _run_loop)
        self._background_started = threading.Event()
        self._lock = threading.Lock()
        self._starting = threading.RLock()
        self._state = "new"
        self._errors: list[tuple[str, Exception, int]] = []  # (stage, error, failures)
        self._join_timeout = join_timeout
        nodes = self.nodes
        self._reporter = (
            StatsReporter(report_stats_interval, lambda: [n.stats() for n in nodes])
            if report_stats_interval > 0
            else None
        )
        # The tracer and the autotuner see each stage through its protocol, never its class.
        traced = [t for n in self.nodes if (t := n.for_tracer()) is not None]
        self._tracer = Tracer(traced, self.channels) if trace else None
        read = [r for n in self.nodes if (r := n.for_autotuner()) is not None]
        sink = self.channels[-1]
        self._autotuner = (
            Autotuner(read, lambda: sink.n_gets, autotune, trace=self._tracer)
            if autotune is not None and any(s.tunable for s in read)
            else None
        )

    # -- registration (called by nodes from launch) -------------------------------------
    def spawn_thread(self, target: Callable[[], None], name: str) -> None:
        self._threads.append(self._owned_thread(target, name))

    def spawn_task(self, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._task_factories.append(factory)

    def start_thread(self, target: Callable[[], None], name: str) -> bool:
        """Start one more owned thread while running (autotuned stages grow so); False once
        the pipeline is stopping, so that shutdown joins every thread ever started."""
        with self._lock:
            if self._state != "running":
                return False
            thread = self._owned_thread(target, name)
            self._threads.append(thread)
            thread.start()
        return True

    def _owned_thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        """A thread of this runtime. One that outlives shutdown's bounded join (an op still
        running) clears the recorded errors' frames itself when it ends: shutdown could not,
        as their frames were still executing, and until cleared they hold the items (and
        the batch arenas) that the stage worked on."""

        def run() -> None:
            try:
                target()
            finally:
                if self._state == "stopped":
                    self._clear_error_frames()

        return threading.Thread(target=run, name=name, daemon=True)

    def _clear_error_frames(self) -> None:
        with self._lock:
            errors = [error for _, error, _ in self._errors]
        for error in errors:
            # The frames in the errors' tracebacks keep their lines (for the report) but
            # drop their locals, which hold the stages, this runtime and the items they
            # worked on; a frame still executing is skipped.
            traceback.clear_frames(error.__traceback__)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        with self._starting:  # shutdown waits for a start under way before it joins
            with self._lock:
                if self._state != "new":
                    raise RuntimeError(f"a pipeline can be started only once (it is {self._state})")
                self._state = "running"
            for node in self.nodes:
                node.bind(self)
                node.launch(self)
            if self._tracer is not None:
                self._tracer.reset_origin()  # time 0 of the trace is now
            if self._autotuner is not None:
                # First, so that its first reading is before any item: started after the
                # loop's thread, it waited for the GIL while the loop started its coroutines,
                # and its first look at them came 2 ms after they began to wait.
                self._threads.append(self._autotuner.thread)
                self._autotuner.thread.start()
            if self._task_factories or self._background:
                self._loop = asyncio.new_event_loop()
                # asyncio's own default executor, but named and owned: shut down in _run_loop.
                self._loop.set_default_executor(
                    ThreadPoolExecutor(thread_name_prefix="torch_spdl_async")
                )
                loop_thread = self._owned_thread(self._run_loop, "torch_spdl-loop")
                self._threads.append(loop_thread)
                if self._background:
                    # Background tasks (a queue class's stage hooks among them) take their
                    # first step before any item moves: a short pipeline's threads could
                    # otherwise finish before the loop ran them at all.
                    loop_thread.start()
                    self._background_started.wait()
            if self._reporter is not None:
                self._threads.append(self._reporter.thread)
            if self._tracer is not None:
                self._threads.append(self._tracer.thread)
            with self._lock:  # start_thread may append while these start
                threads = list(self._threads)
            for thread in threads:
                if thread.ident is None:  # the loop's may have started already
                    thread.start()

    def _run_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)

        async def main() -> None:
            self._main_task = asyncio.current_task()
            if self._state != "running":
                return  # _run_loop's finally releases start()
            background = [
                asyncio.create_task(run_background(f), name=f"torch_spdl-background-{i}")
                for i, f in enumerate(self._background)
            ]
            try:
                if background:
                    await asyncio.sleep(0)  # each runs up to its first await
            finally:
                self._background_started.set()  # start() goes on, whatever happened
            try:
                await asyncio.gather(*(factory() for factory in self._task_factories))
                if background:  # they live until stop() cancels this task
                    await asyncio.get_running_loop().create_future()
            finally:
                for task in background:
                    task.cancel()
                if background:
                    await asyncio.wait(background)

        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # a task died outside its own handler
            if not isinstance(exc, Exception):
                wrapped = RuntimeError(f"the event loop stopped: {type(exc).__name__}: {exc}")
                wrapped.__cause__ = exc
                exc = wrapped
            self.fail(exc)
        finally:
            self._background_started.set()  # never leave start() waiting
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                try:
                    # Waits for every to_thread call still running (an op cancelled by stop()
                    # returns there); shutdown() joins this thread, so it waits for them too.
                    loop.run_until_complete(loop.shutdown_default_executor())
                finally:
                    loop.close()

    @property
    def state(self) -> str:
        """``"new"``, ``"running"`` or ``"stopped"``."""
        return self._state

    def fail(
        self, error: Exception, *, node: SupervisedStage | None = None, num_failures: int = 0
    ) -> None:
        """Record a stage's (or the engine's) error and stop what feeds it.

        With ``node``, only the channels upstream of it are aborted: the source and the
        stages before stop, while what is already past the failing node still flows to the
        consumer, followed by the failure (the node closes its outbox with it). Without
        ``node`` (the engine itself broke) every channel is aborted.
        """
        with self._lock:
            # Recorded even while stopping: an op that fails as ``stop()`` joins its thread
            # still failed, and ``stop()`` reports every error once the threads are joined.
            name = node.name if node is not None else "engine"
            error.add_note(f"Pipeline stage: {name} (torch_spdl: this stage failed the pipeline)")
            self._errors.append((name, error, num_failures))
            if self._state == "stopped":
                return
        if node is None:
            upstream = self.channels
        else:  # the channels before the node: its inbox and everything feeding it
            position = next(i for i, n in enumerate(self.nodes) if n is node)
            upstream = self.channels[:position]
        for channel in upstream:
            channel.abort(self.failure)

    @property
    def failure(self) -> PipelineFailure | None:
        """Every error recorded so far as one ``PipelineFailure``; None while all is well.

        A new one at each read: each is raised once, so that no traceback (which holds the
        raising frame, a pipeline's ``stop()`` among them) is kept by the runtime, which
        that frame holds in turn."""
        with self._lock:
            if not self._errors:
                return None
            stages, errors, counts = zip(*self._errors, strict=True)
        return PipelineFailure(exceptions=list(errors), stages=list(stages), num_failures=counts[0])

    def shutdown(
        self, timeout: float | None = None, *, keep_sink: deque[Any] | None = None
    ) -> None:
        """Stop every worker and join every thread (idempotent, safe from any thread).

        ``timeout`` bounds the wait for the threads (default: the runtime's join timeout);
        ``keep_sink`` receives what the sink holds (for ``get_item()`` after ``stop()``)
        instead of it being dropped.
        """
        with self._lock:
            if self._state == "stopped":
                return
            was_running = self._state == "running"
            self._state = "stopped"
        for channel in self.channels[:-1]:
            channel.abort(STOPPED)
        # get_item() after an explicit stop() returns what the sink held (SPDL's behaviour);
        # otherwise nobody will read it, and it may hold large batches: drop it.
        self.channels[-1].abort(STOPPED, keep_into=keep_sink)
        if not was_running:
            self.parts.shutdown()  # made with the declaration, they may run already
            return
        with self._starting:
            pass  # let a start() under way in another thread finish launching first
        self.parts.shutdown()  # before the joins: a worker waiting on one returns
        if self._reporter is not None:
            self._reporter.stop()
        if self._autotuner is not None:
            self._autotuner.stop()
        if self._tracer is not None:
            self._tracer.stop()
        for node in self.nodes:
            node.on_stop()
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._cancel_main)
            except RuntimeError:
                pass  # the loop already finished
        join_timeout = self._join_timeout if timeout is None else timeout
        deadline = time.monotonic() + join_timeout
        me = threading.current_thread()
        for thread in list(self._threads):
            if thread is me or thread.ident is None:
                continue  # our own worker (a finalizer ran there), or never started
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                _LG.warning(
                    "thread %r did not stop within %.1f s: an op is still running and cannot be "
                    "interrupted; it will exit when that op returns",
                    thread.name,
                    join_timeout,
                )
        self._clear_error_frames()  # the threads have returned (a late one clears at its end)

    def _cancel_main(self) -> None:
        if self._main_task is not None:
            self._main_task.cancel()

    def trace(self) -> PipelineTrace:
        if self._tracer is None:
            raise RuntimeError(
                "this pipeline was built without tracing: build it with build(..., trace=True)"
            )
        return self._tracer.snapshot()

    @property
    def autotuner(self) -> Autotuner | None:
        return self._autotuner
