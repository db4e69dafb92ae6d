"""The base every stage shares: lifecycle, counters, failure policy and end of stream.

The contract itself (what the runtime calls on a stage, what a stage may ask of the
runtime) is written in ``_core/protocols.py``; this is the one implementation of it that every
stage derives from.

A node reads its ``inbox`` channel, writes its ``outbox`` channel and runs workers,
threads or coroutines that the runtime owns. How a stage *ends* is written once, here, for
every kind of node (a sync or async source, a thread or async stage, an aggregate, a
region, path variants): each worker, as it exits, calls :meth:`Node.end_worker` (from a
thread) or :meth:`Node.aend_worker` (from a coroutine), and the template runs

1. :meth:`~Node.release_parked` (every worker): workers parked by an autotuned stage leave
   too, since the input ended or the stage stops;
2. record that the worker left; only the last one of the stage goes on;
3. :meth:`~Node.flush`: what the stage still holds (aggregate's partial batch) goes out;
4. :meth:`~Node.exit_stage_hooks`: the stage hooks are left, once per stage;
5. the outbox is closed, once, with this node's failure or the upstream's end-of-stream
   error, so the end of the stream (and any error) travels down the chain in order.

Stages differ only in those overridable steps, never in the sequence. The count of live
workers belongs to the base: a node starts ``workers`` workers at launch, and a stage that
grows while running asks for one more with :meth:`Node.join_worker`.

A failed item is logged once, counted, and dropped; past its ``max_failures`` budget the
node fails the pipeline: the runtime stops everything upstream of it, and the node closes
its outbox with the failure, so what was already made downstream still reaches the
consumer ahead of the error.

Why this file is one piece (just under 500 lines): :class:`Node` is the template and
:class:`OpStage` is its one specialisation that runs a user's op (stage hooks, the surface
the autotuner and tracer read). The end-of-stream steps that ``OpStage`` overrides
(``exit_stage_hooks``) are called from the template above it; split, each half would be
read only beside the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._autotune.meter import StageMeter
from .._core.errors import describe_item
from .._core.protocols import QueueReading, StageReading
from .._core.stats import Counters, StageStats
from .._declare.failures import FailureLimit
from .._declare.ops import OpKind
from .._wire.channel import Channel, ChannelAborted

if TYPE_CHECKING:
    from .._core.protocols import StageTracer, Supervisor, TracedStage, TunableStage
    from .._plugins.hooks import TaskHook

__all__ = ["Node", "OpStage"]

_LG = logging.getLogger("torch_spdl.pipeline")


class Node:
    """Base class of sources and stages. Subclasses implement :meth:`launch`, which starts
    ``workers`` workers; each worker ends with :meth:`end_worker` or :meth:`aend_worker`."""

    max_workers: int | None = None  # set for an autotuned stage: the most it may grow to

    def __init__(
        self,
        name: str,
        inbox: Channel[Any] | None,
        outbox: Channel[Any],
        *,
        workers: int = 1,
        max_failures: int = -1,
        budget: FailureLimit | None = None,
    ) -> None:
        self.name = name
        self.inbox = inbox
        self.outbox = outbox
        self.workers = workers  # how many workers launch() starts
        if budget is None:
            budget = FailureLimit(max_failures, self.invocations)
        self.budget = budget
        self._failure: BaseException | None = None  # why this node failed the pipeline
        self._counters: list[Counters] = []
        self._lock = threading.Lock()
        # The worker count, owned here: workers started so far, and those not yet left.
        self._started = workers
        self._live = workers
        self._num_failed = 0
        self._started_at = 0.0
        self._finished_at = 0.0
        self._runtime: Supervisor | None = None

    @property
    def concurrency(self) -> int:
        """How many workers may run the op now (fixed unless the stage is autotuned)."""
        return self.workers

    @property
    def finished(self) -> bool:
        """True once every worker has left."""
        return bool(self._finished_at)

    @property
    def started_workers(self) -> int:
        """Workers started so far: launch's, and those joined since (:meth:`join_worker`)."""
        return self._started

    # -- what the runtime's helpers see (SupervisedStage.for_autotuner / for_tracer) -----
    def for_autotuner(self) -> TunableStage | None:
        """This node as the autotuner reads it; None: the autotuner does not see it."""
        return None

    def for_tracer(self) -> TracedStage | None:
        """This node as the tracer records it; None: it has no op to trace."""
        return None

    # -- lifecycle -----------------------------------------------------------------------
    def launch(self, runtime: Supervisor) -> None:
        """Register this node's ``workers`` workers with the runtime (which starts them)."""
        raise NotImplementedError

    def bind(self, runtime: Supervisor) -> None:
        self._runtime = runtime
        self._started_at = time.perf_counter()

    def on_stop(self) -> None:
        """Called once when the pipeline stops; release what the workers may block on."""

    def new_counters(self) -> Counters:
        counters = Counters()
        with self._lock:
            self._counters.append(counters)
        return counters

    def join_worker(self) -> int | None:
        """Count one more worker of a running stage (an autotuned stage grows); its index,
        or None once the stage has ended. It ends with :meth:`end_worker`, started or not."""
        with self._lock:
            if self._finished_at:
                return None
            self._live += 1
            index = self._started
            self._started += 1
            return index

    # -- end of stream: one template (see the module notes) ------------------------------
    def end_worker(self) -> None:
        """End a worker thread; the last one of the stage flushes, leaves the stage hooks
        and closes the outbox. Blocks while the outbox is full."""
        if not self._leave():
            return
        counters, outs = self.new_counters(), self._flushed()
        try:
            for item in outs:  # a partial batch goes out even before an upstream error
                self.outbox.put(item)
                counters.num_out += 1
        except ChannelAborted:
            pass  # stopped meanwhile: nobody reads what was held
        self.exit_stage_hooks()
        self.outbox.close(self.end_error())

    async def aend_worker(self) -> None:
        """:meth:`end_worker` for a worker coroutine: the same steps, awaiting where a
        thread blocks (putting flushed items, leaving the stage hooks)."""
        if not self._leave():
            return
        counters, outs = self.new_counters(), self._flushed()
        try:
            for item in outs:
                await self.outbox.aput(item)
                counters.num_out += 1
        except ChannelAborted:
            pass
        await self.aexit_stage_hooks()
        self.outbox.close(self.end_error())

    def release_parked(self) -> None:
        """Step 1, run by every worker as it exits: let workers that wait for a turn (an
        autotuned stage's parked ones) leave too."""

    def _leave(self) -> bool:
        """Step 2 (with step 1): record that a worker left; True for the last one."""
        self.release_parked()
        with self._lock:
            self._live -= 1
            if self._live:
                return False
            self._finished_at = time.perf_counter()
            return True

    def flush(self) -> Iterable[Any]:
        """Step 3: the items the stage still holds after its input ended (aggregate's
        partial batch); none by default."""
        return ()

    def _flushed(self) -> list[Any]:
        try:
            return list(self.flush())
        except Exception as exc:  # a custom aggregator's flush(): fail, never hang
            exc.add_note(f"torch_spdl: raised by flush() at the end of stage {self.name!r}")
            self.fail(exc)
            return []

    def exit_stage_hooks(self) -> None:
        """Step 4 from a thread: leave the stage hooks (none by default)."""

    async def aexit_stage_hooks(self) -> None:
        """Step 4 from a coroutine: leave the stage hooks (none by default)."""

    def upstream_error(self) -> BaseException | None:
        return self.inbox.close_error if self.inbox is not None else None

    def end_error(self) -> BaseException | None:
        """Step 5: what to close the outbox with: this node's failure, or the upstream's.

        Called once, by the last worker to leave. A failure rate is checked here too, so
        that failures made during the probation count once the stage has seen enough.
        """
        with self._lock:
            failed_here = self._num_failed
        if (
            self._failure is None
            and self.upstream_error() is None
            and failed_here  # a shared budget is tripped by the stage whose failure tips it
            and self.budget.is_rate  # a count is checked as each failure is added
            and self.budget.exceeded()
        ):
            self._trip(None, None)
        return self._failure or self.upstream_error()

    def invocations(self) -> int:
        """Items taken so far (read when an item fails; the workers count lock-free)."""
        with self._lock:
            counters = list(self._counters)
        return sum(c.num_in for c in counters)

    # -- failures ------------------------------------------------------------------------
    def record_failure(self, item: Any, exc: Exception) -> None:
        """Log and count a failed item; fail the pipeline past the ``max_failures`` budget."""
        with self._lock:
            self._num_failed += 1
        _LG.error(
            "stage %r failed on item %s: %s: %s",
            self.name,
            describe_item(item),
            type(exc).__name__,
            exc,
            exc_info=_LG.isEnabledFor(logging.DEBUG),
        )
        if self.budget.add() and self._failure is None:
            self._trip(item, exc)

    def _trip(self, item: Any, exc: Exception | None) -> None:
        """Fail the pipeline because this stage went over its budget."""
        with self._lock:
            count = self._num_failed
        limit = self.budget.describe()
        if exc is None:  # a rate found exceeded when the stage ended
            exc = RuntimeError(
                f"stage {self.name!r} ended with {self.budget.count} failures in "
                f"{self.budget.invocations()} items, more than {limit}"
            )
        else:
            exc.add_note(
                f"torch_spdl: stage {self.name!r} failed on item {describe_item(item)}; "
                f"{self.budget.count} failures, more than {limit}"
            )
        self.fail(exc, num_failures=count)

    def fail(self, error: BaseException, *, num_failures: int = 0) -> None:
        """Fail the pipeline with ``error`` (raised by this node's op, source or engine).

        The runtime stops every node upstream; this node's workers finish what they hold
        and the last one closes the outbox with the failure (see :meth:`end_error`).
        """
        if not isinstance(error, Exception):  # an ExceptionGroup holds Exceptions only
            wrapped = RuntimeError(f"{type(error).__name__}: {error}")
            wrapped.__cause__ = error
            error = wrapped
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
        assert self._runtime is not None
        self._runtime.fail(error, node=self, num_failures=num_failures)
        self.unblock_workers()

    def unblock_workers(self) -> None:
        """Wake workers that wait on something other than a channel (an input-order window,
        an autotuner's parking), so that they reach the aborted input and leave; a worker
        that failed may never emit its place in the order."""

    def crash(self, exc: BaseException) -> None:
        """A worker hit an error outside the user's op: never leave the consumer hanging."""
        if isinstance(exc, Exception):
            exc.add_note(f"torch_spdl: stage {self.name!r} stopped on an internal error")
        self.fail(exc)

    # -- stats ---------------------------------------------------------------------------
    def stats(self) -> StageStats:
        with self._lock:
            counters = list(self._counters)
            failed = self._num_failed
        inbox = self.inbox
        gets = inbox.n_gets if inbox is not None else 0
        depth = inbox.depth_sum / gets if inbox is not None and gets else 0.0
        return StageStats(
            name=self.name,
            concurrency=self.concurrency,
            num_in=sum(c.num_in for c in counters),
            num_out=sum(c.num_out for c in counters),
            num_failed=failed,
            op_time=sum(c.op_time for c in counters),
            queue_depth=depth,
            queue_capacity=inbox.capacity if inbox is not None else 0,
            elapsed=(self._finished_at or time.perf_counter()) - self._started_at
            if self._started_at
            else 0.0,
            max_concurrency=self.max_workers,
        )


class OpStage(Node):
    """A node that applies a user op with ``workers`` workers, in completion or input order.

    For input order, each item gets a sequence number as it is taken, and results are
    emitted strictly by sequence number (``_pending`` holds those that finished early).

    With ``max_workers`` set the stage is autotuned: the ``workers`` argument is only the
    concurrency it starts with, and :meth:`set_concurrency` moves the number of workers
    allowed to take items (:attr:`concurrency`) between :attr:`floor` and :attr:`bound`
    while it runs; the workers above it are parked. A stage whose workers cost no thread
    (``starts_every_worker``) starts all ``bound`` of them at launch, the others start
    theirs as the concurrency grows (:meth:`Node.join_worker`).
    ``tracer``, when set before launch, records when each item's op started and ended.
    An op stage is what the autotuner reads (:class:`TunableStage`), tuned or not; an
    autotuned one's op is metered (wall and CPU time per item) from launch, and
    ``tune_key`` names it in what the tuner remembers between builds.
    """

    inbox: Channel[Any]  # a stage always has an input, unlike a source
    starts_every_worker = False  # True: launch starts `bound` workers and parks the excess

    def __init__(
        self,
        name: str,
        op: Callable[[Any], Any],
        kind: OpKind,
        inbox: Channel[Any],
        outbox: Channel[Any],
        *,
        workers: int,
        ordered: bool,
        max_failures: int = -1,
        max_workers: int | None = None,
        budget: FailureLimit | None = None,
        hooks: Sequence[TaskHook] = (),
        tune_key: Hashable | None = None,
        min_workers: int = 1,
    ) -> None:
        bound = max_workers if max_workers is not None else workers
        concurrency = min(workers, bound)
        super().__init__(
            name,
            inbox,
            outbox,
            workers=bound if self.starts_every_worker else concurrency,
            max_failures=max_failures,
            budget=budget,
        )
        self.bound = bound  # the most workers this stage ever runs
        self.floor = min_workers  # the fewest an autotuned stage runs
        self.max_workers = max_workers
        self._concurrency = concurrency  # workers allowed to take items
        self.tune_key = tune_key
        self.meter: StageMeter | None = None
        self.hooks = list(hooks)
        self._stage_stack: contextlib.AsyncExitStack | None = None
        self.op = op
        self.kind = kind
        self.ordered = ordered and bound > 1
        self._next_seq = 0
        self._next_emit = 0
        self._pending: dict[int, Any] = {}
        self.window = 2 * bound  # most items taken and not yet emitted, in input order
        self.tracer: StageTracer | None = None

    @property
    def concurrency(self) -> int:
        return self._concurrency

    # -- the autotuner's surface (TunableStage) and the tracer's (TracedStage) ------------
    @property
    def tunable(self) -> bool:
        """True for an autotuned stage (``concurrency="auto"``)."""
        return self.max_workers is not None

    def for_autotuner(self) -> TunableStage:
        return self

    def for_tracer(self) -> TracedStage:
        return self

    def bind(self, runtime: Supervisor) -> None:
        super().bind(runtime)
        # Meter an autotuned op on our own workers (an executor's op may have to pickle).
        if self.tunable and self.meter is None and getattr(self, "executor", None) is None:
            meter = self.meter = StageMeter()
            if self.kind is OpKind.ASYNC_FUNC:
                self.op = meter.wrap_async(self.op)
            elif self.kind is OpKind.ASYNC_GEN:
                self.op = meter.wrap_async_gen(self.op)
            else:
                self.op = meter.wrap_sync(self.op, generator=self.kind is OpKind.GEN)

    def reading(self) -> StageReading:
        """Cumulative counters for the autotuner."""
        metered: int | None = None
        pending, since = 0, None
        if self.meter is not None:
            items, metered, busy, cpu = self.meter.totals()
            pending, since = self.meter.waiting() or (0, None)
        else:
            with self._lock:
                counters = list(self._counters)
            items = sum(c.num_in for c in counters)
            busy, cpu = sum(c.op_time for c in counters), None
        return StageReading(
            items,
            busy,
            cpu,
            QueueReading.of(self.inbox),
            QueueReading.of(self.outbox),
            metered,
            pending,
            since,
        )

    def set_concurrency(self, n: int) -> int:
        """Allow ``n`` workers (clamped to floor..bound); returns the value applied."""
        if not self.tunable:
            raise RuntimeError(f"stage {self.name!r} has a fixed concurrency")
        n = max(self.floor, 1, min(int(n), self.bound))
        self._resize(n)
        return n

    def _resize(self, n: int) -> None:
        """Apply a new concurrency; the subclasses wake or start workers."""
        self._concurrency = n

    # -- stage hooks (only for stages built with hooks) ------------------------------------
    def enter_stage_hooks(self) -> None:
        """Enter every hook's ``stage_hook()`` (from ``launch``, on a private loop).

        An error fails the pipeline: the stage's input is aborted, so its workers leave at
        once and close its output with the error.
        """
        if not self.hooks:
            return
        stack = contextlib.AsyncExitStack()

        async def enter() -> None:
            for hook in self.hooks:
                await stack.enter_async_context(hook.stage_hook())

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(enter())
            self._stage_stack = stack
        except Exception as exc:
            with contextlib.suppress(Exception):
                loop.run_until_complete(stack.aclose())
            self._hook_failed(exc)
        finally:
            loop.close()

    def exit_stage_hooks(self) -> None:
        """Leave the stage hooks from a worker thread (the last one, as the stage ends)."""
        if self._stage_stack is None:
            return
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self.aexit_stage_hooks())
        finally:
            loop.close()

    async def aexit_stage_hooks(self) -> None:
        """Leave the stage hooks from a coroutine (the last one, as the stage ends)."""
        stack, self._stage_stack = self._stage_stack, None
        if stack is None:
            return
        try:
            await stack.aclose()
        except Exception as exc:
            self._hook_failed(exc)

    def _hook_failed(self, exc: Exception) -> None:
        exc.add_note(f"torch_spdl: raised by a stage_hook() of stage {self.name!r}")
        self.fail(exc)
