"""The base every stage shares: a worker's life, counters, failure policy, end of stream.

The contract itself (what the runtime calls on a stage, what a stage may ask of the
runtime) is written in ``_core/protocols.py``; :class:`Node` is the one implementation of
it that every stage derives from, and it keeps a stage's worker to one method.

**A worker implements one method.** A node runs ``workers`` workers, threads or coroutines
that the runtime owns (``on_loop`` picks which). Each is one call of :meth:`Node.work`
(a thread) or :meth:`Node.awork` (a coroutine) with the worker's index and its own
:class:`Counters`; the node's subclass writes that method and nothing of a worker's life
around it. The worker

- returns when its input ends (``EOF``), or when the node has nothing more to do;
- lets :class:`ChannelAborted` go: the pipeline is stopping, or a failure aborted its
  channels, and the base ends the worker quietly;
- routes an error raised by the user's code for one item to
  :meth:`Node.record_failure` (logged, counted, dropped; past the ``max_failures``
  budget it fails the pipeline), and an error of its own kind to :meth:`Node.fail`;
- lets anything else go: the base reports it as an internal error of the stage (it fails
  the pipeline with a note naming the stage), so the consumer never waits forever.

The base owns the rest: it starts the workers (:meth:`Node.launch`; a stage that grows
while running starts one more with :func:`start_worker`), counts them, and ends each one
through one template, the same for every kind of node (a sync or async source, a thread
or async stage, an aggregate, a region, path variants). As a worker exits:

1. :meth:`~Node.release_parked` (every worker): workers parked by an autotuned stage leave
   too, since the input ended or the stage stops;
2. the base records that the worker left; only the last one of the stage goes on;
3. :meth:`~Node.flush`: what the stage still holds (aggregate's partial batch) goes out;
4. the stage hooks (``stage_hooks``, :mod:`.stage_hooks`) are left, once per stage;
5. the outbox is closed, once, with this node's failure or the upstream's end-of-stream
   error, so the end of the stream (and any error) travels down the chain in order.

Stages differ only in those overridable steps, never in the sequence.

A failed item is logged once, counted, and dropped; past its ``max_failures`` budget the
node fails the pipeline: the runtime stops everything upstream of it, and the node closes
its outbox with the failure, so what was already made downstream still reaches the
consumer ahead of the error. The stage that runs a user's op is :mod:`.op_stage`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any
from weakref import WeakMethod, ref

from .._core.errors import describe_item
from .._core.stats import Counters, StageStats
from .._declare.failures import FailureLimit
from .._wire.channel import Channel, ChannelAborted
from .stage_hooks import StageHooks

if TYPE_CHECKING:
    from .._core.protocols import Supervisor, TracedStage, TunableStage

__all__ = ["Node", "start_worker"]

_LG = logging.getLogger("torch_spdl.pipeline")


class Node:
    """Base class of sources and stages (see the module notes for the contract).

    A subclass implements :meth:`work` (threads) or :meth:`awork` (coroutines, with
    ``on_loop`` True), and overrides the end-of-stream steps it needs.
    """

    max_workers: int | None = None  # set for an autotuned stage: the most it may grow to
    on_loop = False  # True: the workers are coroutines on the pipeline's loop (awork)
    stage_hooks: StageHooks | None = None  # the stage_hook() contexts, left by the last

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
        self.concurrency = workers  # how many may run at once (moved by an autotuned stage)
        if budget is None:  # its own, reading this node weakly (a cycle would outlive it)
            budget = FailureLimit(max_failures, partial(_weak_call, WeakMethod(self.invocations)))
        self.budget = budget
        self._failure: BaseException | None = None  # why this node failed the pipeline
        self._counters: list[Counters] = []
        self._lock = threading.Lock()
        # The worker count, owned here: workers started so far, and those not yet left.
        self.started_workers = workers
        self._live = workers
        self.finished = False  # True once every worker has left
        self._num_failed = 0
        self._started_at = 0.0
        self._finished_at = 0.0
        # The runtime, held weakly: it holds this node, and a cycle would outlive both.
        self._runtime_ref: Callable[[], Supervisor | None] | None = None  # set by bind()

    # -- what the runtime's helpers see (SupervisedStage.for_autotuner / for_tracer) -----
    def for_autotuner(self) -> TunableStage | None:
        """This node as the autotuner reads it; None: the autotuner does not see it."""
        return None

    def for_tracer(self) -> TracedStage | None:
        """This node as the tracer records it; None: it has no op to trace."""
        return None

    # -- lifecycle -----------------------------------------------------------------------
    def bind(self, runtime: Supervisor) -> None:
        self._runtime_ref = ref(runtime)
        self._started_at = time.perf_counter()

    def launch(self, runtime: Supervisor) -> None:
        """Register this node's ``workers`` workers with the runtime (which starts them)."""
        for index in range(self.workers):
            if self.on_loop:
                runtime.spawn_task(partial(_task_worker, self, index))
            else:
                runtime.spawn_thread(
                    partial(_thread_worker, self, index), _thread_name(self, index)
                )

    def work(self, index: int, counters: Counters) -> None:
        """Worker ``index``'s loop, on a thread of its own (the contract: module notes)."""
        raise NotImplementedError

    async def awork(self, index: int, counters: Counters) -> None:
        """Worker ``index``'s loop as a coroutine on the pipeline's loop (``on_loop``)."""
        raise NotImplementedError

    def on_stop(self) -> None:
        """Called once when the pipeline stops; release what the workers may block on."""

    def unblock_workers(self) -> None:
        """Wake workers that wait on something other than a channel (an input-order window,
        an autotuner's parking), so that they reach the aborted input and leave; a worker
        that failed may never emit its place in the order."""

    # -- the end-of-stream steps a stage may override (see the module notes) -------------
    def release_parked(self) -> None:
        """Step 1, run by every worker as it exits: let workers that wait for a turn (an
        autotuned stage's parked ones) leave too."""

    def flush(self) -> Iterable[Any]:
        """Step 3: the items the stage still holds after its input ended (aggregate's
        partial batch); none by default."""
        return ()

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
            _over_budget(self, item, exc)

    def fail(self, error: BaseException, *, num_failures: int = 0) -> None:
        """Fail the pipeline with ``error`` (raised by this node's op, source or engine).

        The runtime stops every node upstream; this node's workers finish what they hold
        and the last one closes the outbox with the failure (see :func:`_end_error`).
        """
        if not isinstance(error, Exception):  # an ExceptionGroup holds Exceptions only
            wrapped = RuntimeError(f"{type(error).__name__}: {error}")
            wrapped.__cause__ = error
            error = wrapped
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
        assert self._runtime_ref is not None, "a node fails only once bound to its runtime"
        runtime = self._runtime_ref()
        if runtime is not None:  # None: its pipeline is gone, with nobody left to tell
            runtime.fail(error, node=self, num_failures=num_failures)
        self.unblock_workers()

    def invocations(self) -> int:
        """Items taken so far (read when an item fails; the workers count lock-free)."""
        with self._lock:
            counters = list(self._counters)
        return sum(c.num_in for c in counters)

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


# -- a worker's life, owned by the base ----------------------------------------------------
def _thread_name(node: Node, index: int) -> str:
    """A worker thread's name: the stage's, numbered when it may have several."""
    alone = node.workers == 1 and node.max_workers is None
    return f"torch_spdl-{node.name}" if alone else f"torch_spdl-{node.name}-{index}"


def _thread_worker(node: Node, index: int) -> None:
    """A worker thread: the node's loop, then the end of stream (module notes)."""
    try:
        node.work(index, _new_counters(node))
    except ChannelAborted:
        pass  # stopped, or a failure aborted the channels: leave quietly
    except BaseException as exc:
        _internal_error(node, exc)
    finally:
        _end_thread(node)


async def _task_worker(node: Node, index: int) -> None:
    """A worker coroutine: the node's loop, then the end of stream (module notes)."""
    try:
        await node.awork(index, _new_counters(node))
    except ChannelAborted:
        pass
    except Exception as exc:  # a cancellation goes on: the loop is being torn down
        _internal_error(node, exc)
    finally:
        await _end_task(node)


def start_worker(node: Node) -> bool:
    """Start one more worker thread of a running node (an autotuned stage grows); False
    once the node has ended or the pipeline stops. A worker counted and never started
    leaves as any worker does."""
    runtime = node._runtime_ref() if node._runtime_ref is not None else None
    if runtime is None:
        return False
    with node._lock:
        if node.finished:
            return False
        node._live += 1
        index = node.started_workers
        node.started_workers += 1
    if not runtime.start_thread(partial(_thread_worker, node, index), _thread_name(node, index)):
        _end_thread(node)
        return False
    return True


def _new_counters(node: Node) -> Counters:
    counters = Counters()
    with node._lock:
        node._counters.append(counters)
    return counters


def _internal_error(node: Node, exc: BaseException) -> None:
    """A worker hit an error outside the user's op: never leave the consumer hanging."""
    if isinstance(exc, Exception):
        exc.add_note(f"torch_spdl: stage {node.name!r} stopped on an internal error")
    node.fail(exc)


# -- end of stream: one template (see the module notes) ------------------------------------
def _end_thread(node: Node) -> None:
    """End a worker thread; the last one of the stage flushes, leaves the stage hooks and
    closes the outbox. Blocks while the outbox is full."""
    if not _leave(node):
        return
    counters, outs = _new_counters(node), _flushed(node)
    try:
        for item in outs:  # a partial batch goes out even before an upstream error
            node.outbox.put(item)
            counters.num_out += 1
    except ChannelAborted:
        pass  # stopped meanwhile: nobody reads what was held
    hooks = node.stage_hooks
    if hooks is not None and (error := hooks.exit()) is not None:
        node.fail(error)
    node.outbox.close(_end_error(node))


async def _end_task(node: Node) -> None:
    """:func:`_end_thread` for a worker coroutine: the same steps, awaiting where a thread
    blocks (putting flushed items, leaving the stage hooks)."""
    if not _leave(node):
        return
    counters, outs = _new_counters(node), _flushed(node)
    try:
        for item in outs:
            await node.outbox.aput(item)
            counters.num_out += 1
    except ChannelAborted:
        pass
    hooks = node.stage_hooks
    if hooks is not None and (error := await hooks.aexit()) is not None:
        node.fail(error)
    node.outbox.close(_end_error(node))


def _leave(node: Node) -> bool:
    """Steps 1 and 2: let parked workers go, and record that a worker left; True for the
    last one."""
    node.release_parked()
    with node._lock:
        node._live -= 1
        if node._live:
            return False
        node._finished_at = time.perf_counter()
        node.finished = True
        return True


def _flushed(node: Node) -> list[Any]:
    """Step 3: what the stage still holds, as a list."""
    try:
        return list(node.flush())
    except Exception as exc:  # a custom aggregator's flush(): fail, never hang
        exc.add_note(f"torch_spdl: raised by flush() at the end of stage {node.name!r}")
        node.fail(exc)
        return []


def _end_error(node: Node) -> BaseException | None:
    """Step 5: what to close the outbox with: this node's failure, or the upstream's.

    Called once, by the last worker to leave. A failure rate is checked here too, so that
    failures made during the probation count once the stage has seen enough.
    """
    upstream = node.inbox.close_error if node.inbox is not None else None
    with node._lock:
        failed_here = node._num_failed
    if (
        node._failure is None
        and upstream is None
        and failed_here  # a shared budget is tripped by the stage whose failure tips it
        and node.budget.is_rate  # a count is checked as each failure is added
        and node.budget.exceeded()
    ):
        _over_budget(node, None, None)
    return node._failure or upstream


def _weak_call(method: WeakMethod[Any]) -> int:
    """``method()``, or 0 once its object is gone."""
    bound = method()
    return 0 if bound is None else bound()


def _over_budget(node: Node, item: Any, exc: Exception | None) -> None:
    """Fail the pipeline because ``node`` went over its budget (on ``item``'s ``exc``; or,
    both None, a rate found exceeded as the stage ended)."""
    with node._lock:
        count = node._num_failed
    budget = node.budget
    limit = budget.describe()
    if exc is None:
        exc = RuntimeError(
            f"stage {node.name!r} ended with {budget.count} failures in "
            f"{budget.invocations()} items, more than {limit}"
        )
    else:
        exc.add_note(
            f"torch_spdl: stage {node.name!r} failed on item {describe_item(item)}; "
            f"{budget.count} failures, more than {limit}"
        )
    node.fail(exc, num_failures=count)
