"""The node that runs a user's op: what thread and async stages share.

:class:`OpStage` is the one specialisation of :class:`~.node.Node` that applies a user's
op (``pipe``, and ``aggregate``/``disaggregate``, which are ops of the engine's own): the
input-order bookkeeping, the stage hooks, the surface the autotuner reads
(:class:`TunableStage`) and the tracer wraps (:class:`TracedStage`), and one rule for an op
that cannot be called at all. How the op runs, on threads or coroutines, is
``thread_stage.py`` and ``async_stage.py``.

**An op that cannot be called fails its stage.** An op whose signature does not take one
argument raises ``TypeError`` on every item; counted item by item it would log as many
errors as there are items and end, past the budget, with the first one. Thread and async
stages treat it the same way (SPDL fails the stage for an async op): the first such item
fails the stage at once, with a note naming the stage and the item. It is told from a
``TypeError`` raised inside the op by binding the op's signature to one argument, once per
stage, only when an item raises ``TypeError``: the hot path pays nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from .._autotune.meter import StageMeter
from .._core.errors import describe_item
from .._core.protocols import QueueReading, StageReading
from .._declare.failures import FailureLimit
from .._declare.ops import OpKind
from .._wire.channel import Channel
from .node import Node
from .stage_hooks import StageHooks

if TYPE_CHECKING:
    from .._core.protocols import StageTracer, Supervisor, TracedStage, TunableStage
    from .._plugins.hooks import TaskHook

__all__ = ["OpStage"]


class OpStage(Node):
    """A node that applies a user op with ``workers`` workers, in completion or input order.

    For input order, each item gets a sequence number as it is taken, and results are
    emitted strictly by sequence number (``_pending`` holds those that finished early).

    With ``max_workers`` set the stage is autotuned: the ``workers`` argument is only the
    concurrency it starts with, and :meth:`set_concurrency` moves the number of workers
    allowed to take items (:attr:`concurrency`) between :attr:`floor` and :attr:`bound`
    while it runs; the workers above it are parked. A stage whose workers cost no thread
    (``starts_every_worker``) starts all ``bound`` of them at launch, the others start
    theirs as the concurrency grows (:func:`~.node.start_worker`).
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
        self.concurrency = concurrency  # workers allowed to take items
        self.tune_key = tune_key
        self.meter: StageMeter | None = None
        self.hooks = list(hooks)
        self.stage_hooks = StageHooks(name, hooks) if hooks else None
        self.op = op
        self._user_op = op  # as given: what an op that cannot be called is checked on
        self._callable: bool | None = None  # whether it takes one argument (once asked)
        self.kind = kind
        self.ordered = ordered and bound > 1
        self._next_seq = 0
        self._next_emit = 0
        self._pending: dict[int, list[Any]] = {}
        self.window = 2 * bound  # most items taken and not yet emitted, in input order
        self.tracer: StageTracer | None = None

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

    def launch(self, runtime: Supervisor) -> None:
        """Enter the stage hooks, then start the workers. A hook's error fails the
        pipeline: the stage's input is aborted, so its workers leave at once and close
        its output with the error."""
        if self.stage_hooks is not None and (error := self.stage_hooks.enter()) is not None:
            self.fail(error)
        super().launch(runtime)

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
        self.concurrency = n

    # -- failures ------------------------------------------------------------------------
    def record_failure(self, item: Any, exc: Exception) -> None:
        """An item's failure (see :meth:`Node.record_failure`), unless the op cannot be
        called at all: then the stage fails (module notes)."""
        if isinstance(exc, TypeError):
            if self._callable is None:
                self._callable = _takes_one_argument(self._user_op)
            if not self._callable:
                exc.add_note(
                    f"torch_spdl: the op of stage {self.name!r} cannot be called on item "
                    f"{describe_item(item)} (does it take exactly one argument?)"
                )
                self.fail(exc)
                return
        super().record_failure(item, exc)


def _takes_one_argument(op: Callable[..., Any]) -> bool:
    """Whether ``op`` can be called with one positional argument (True when its signature
    cannot be read, as for some builtins: its errors are then the items')."""
    try:
        inspect.signature(op).bind(None)
    except TypeError:
        return False
    except ValueError:
        return True
    return True
