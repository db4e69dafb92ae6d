"""The contracts between the engine's layers, in one leaf module that imports none of them.

Imports in ``torch_spdl.pipeline`` run one way, folder by folder: ``_wire``, then
``_core`` and ``_plugins``, ``_autotune``, ``_declare``, ``_stage_kinds``, ``_run``, and the API
on top. Where a lower layer must call up (a stage asks its supervisor to start a thread or
to fail the pipeline; a stage's op is wrapped by the tracer) or an upper layer must read a
lower one through a narrow surface (the autotuner reads a stage), the surface is written
here, as a :class:`~typing.Protocol`, and both sides import it from here:

- :class:`SupervisedStage`: what every node obeys, and all the runtime calls on it;
- :class:`Supervisor`: what a stage may ask of the runtime that runs it;
- :class:`StageTracer`: what a stage asks of the tracer that records its op;
- :class:`TunableStage`: what an autotuned stage exposes to the autotuner, with the
  readings (:class:`StageReading`, :class:`QueueReading`) it reports;
- :class:`InnerPipeline`: what a stage that runs pipelines of its own (``Merge``,
  ``path_variants``) does with them;
- :class:`StoppableSource`: a source that may block in a wait of its own (another
  pipeline), which the pipeline releases as it stops;
- :class:`StoppablePart`: something outside the stages that the pipeline's threads wait
  on (a bound on batches in flight, worker threads or processes), registered with the
  pipeline (``PipelineBuilder.add_stoppable``) and shut down by its runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # data types only: neither module imports anything of the engine
    from .._wire.channel import Channel
    from .stats import StageStats

__all__ = [
    "InnerPipeline",
    "QueueReading",
    "SupervisedStage",
    "StageReading",
    "StageTracer",
    "StoppablePart",
    "StoppableSource",
    "Supervisor",
    "TracedStage",
    "TunableStage",
]


class Supervisor(Protocol):
    """What a stage may ask of the runtime that runs it (passed to ``launch``)."""

    def spawn_thread(self, target: Callable[[], None], name: str) -> None:
        """Register a worker thread, started with the pipeline and joined at its end."""

    def spawn_task(self, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Register a coroutine, run on the pipeline's event loop."""

    def start_thread(self, target: Callable[[], None], name: str) -> bool:
        """Start one more owned thread while running; False once the pipeline stops."""

    def fail(
        self, error: Exception, *, node: SupervisedStage | None = None, num_failures: int = 0
    ) -> None:
        """Fail the pipeline with ``error``, stopping what is upstream of ``node``."""


class SupervisedStage(Protocol):
    """The contract every node of a pipeline obeys; the runtime uses nothing else.

    A stage reads ``inbox`` (None for a source) and writes ``outbox``. The runtime calls
    ``bind`` then ``launch`` once when the pipeline starts (``launch`` registers the
    stage's workers with the supervisor), ``on_stop`` once when it stops, and ``stats``
    whenever asked. It hands the tracer and the autotuner what ``for_tracer`` and
    ``for_autotuner`` return, so neither needs to know a stage's class.

    **A worker implements one method.** A stage's workers (threads, or coroutines on the
    pipeline's loop) each run one loop the stage writes (``Node.work`` / ``Node.awork``).
    The loop returns when its input ends; lets ``ChannelAborted`` go (the pipeline stops,
    or a failure aborted the channels); hands an error of the user's code for one item to
    the stage's failure policy (logged, counted, dropped; past ``max_failures`` the
    pipeline fails) and an error of its own kind to ``fail``; and lets anything else go,
    which is reported as the stage's internal error, so the consumer never waits forever.
    Starting, counting and ending the workers belongs to the base (``_stage_kinds/node.py``),
    never to a stage.

    **End of stream, one template for every stage.** Each worker, as it exits, lets
    parked workers go and records that it left; the last one of the stage then, in this
    order, flushes what the stage still holds (an aggregate's partial batch) into
    ``outbox``, leaves the stage hooks, and closes ``outbox`` once, with the stage's
    failure or else the upstream's end-of-stream error, so the end of the stream travels
    down in order. (The base runs that template after every worker's loop, awaiting
    where a coroutine must; stages override its steps, never the sequence.)
    """

    name: str

    @property
    def finished(self) -> bool:
        """True once every worker has left."""
        ...

    def bind(self, runtime: Supervisor) -> None: ...

    def launch(self, runtime: Supervisor) -> None: ...

    def on_stop(self) -> None: ...

    def stats(self) -> StageStats: ...

    def for_autotuner(self) -> TunableStage | None:
        """This stage as the autotuner reads it (every op stage, tuned or not); None: the
        autotuner does not see it."""
        ...

    def for_tracer(self) -> TracedStage | None:
        """This stage as the tracer records it; None: it has no op to trace."""
        ...


class StageTracer(Protocol):
    """What a traced stage asks of the tracer: its op, wrapped to record one span per call
    (``stage`` is the stage itself, ``worker`` the worker's index)."""

    def wrap(
        self, stage: SupervisedStage, worker: int, op: Callable[..., Any], *, generator: bool
    ) -> Callable[..., Any]: ...

    def wrap_async(
        self, stage: SupervisedStage, worker: int, op: Callable[[Any], Any], *, generator: bool
    ) -> Callable[[Any], Any]: ...


class TracedStage(Protocol):
    """A stage the tracer can record: it wraps its op with ``tracer`` once set."""

    name: str
    tracer: StageTracer | None

    @property
    def concurrency(self) -> int: ...

    @property
    def finished(self) -> bool: ...


@dataclass(frozen=True)
class QueueReading:
    """A queue's counters so far: items taken by its reader, the sum of the depths each
    taker saw, its capacity (0: unbounded) and its depth now."""

    gets: int
    depth_sum: int
    capacity: int
    depth: int

    def occupancy(self, before: QueueReading) -> float:
        """How full the queue was between ``before`` and this reading (0 to 1)."""
        cap = self.capacity
        if not cap:
            return 0.0
        gets = self.gets - before.gets
        if gets > 0:
            return min(((self.depth_sum - before.depth_sum) / gets) / max(cap - 1, 1), 1.0)
        return min(self.depth / cap, 1.0)

    @classmethod
    def of(cls, channel: Channel[Any] | None) -> QueueReading:
        """The reading of ``channel`` now (all zero for no channel)."""
        if channel is None:
            return cls(0, 0, 0, 0)
        return cls(channel.n_gets, channel.depth_sum, channel.capacity, len(channel))


@dataclass(frozen=True)
class StageReading:
    """A stage's cumulative counters: items taken, the wall and CPU seconds its op spent on
    ``metered`` of them (``cpu`` None: not measured; ``metered`` None: on all of them), and
    its input and output queues; and, until the first metered call of an async op finishes,
    how many are in flight (``pending``) and when the first started (``pending_since``,
    ``time.perf_counter``; None after, and for other ops)."""

    items: int
    busy: float
    cpu: float | None
    inbox: QueueReading
    outbox: QueueReading
    metered: int | None = None
    pending: int = 0
    pending_since: float | None = None


class TunableStage(Protocol):
    """What the autotuner needs of a stage, and all it uses."""

    name: str
    tune_key: Hashable | None  # where what was learnt is kept (None: not kept)

    @property
    def concurrency(self) -> int: ...

    @property
    def tunable(self) -> bool: ...

    @property
    def bound(self) -> int: ...

    @property
    def floor(self) -> int: ...

    @property
    def finished(self) -> bool: ...

    def set_concurrency(self, n: int) -> int: ...

    def reading(self) -> StageReading: ...


class InnerPipeline(Protocol):
    """A pipeline run inside a stage (``Merge`` inputs, ``path_variants`` paths), as that
    stage drives it; a :class:`~torch_spdl.pipeline.Pipeline` is one."""

    def start(self) -> None: ...

    def get_iterator(self) -> Iterator[Any]: ...

    def stop(self) -> None:
        """Stop and join it; raise its failure, if any."""

    def stop_source(self) -> None:
        """Stop it because what it feeds is stopping (no failure raised)."""


@runtime_checkable
class StoppableSource(Protocol):
    """A source whose iteration may wait on something of its own (another pipeline's
    output, a bound on what is in flight). The pipeline calls :meth:`stop_source` from
    ``stop()``, from any thread, so that the source thread's wait returns and the thread
    ends: every wait has an owner that can end it."""

    def stop_source(self) -> None: ...


@runtime_checkable
class StoppablePart(Protocol):
    """A part of a run that is not a stage but that stages or the source wait on: a bound
    on the batches in flight, threads that read a dataset, worker processes that make
    batches. Registered with :meth:`~torch_spdl.pipeline.PipelineBuilder.add_stoppable`,
    it is owned by the pipeline's runtime, which calls :meth:`shutdown` once when the
    pipeline stops (``stop()``, the end of an iteration that started it, or the pipeline
    collected; started or not), before it joins its threads: whatever waits on the part
    then returns, so no wait outlives the run and nobody orders the shutdown by hand.

    ``shutdown`` may be called from any thread; it must not raise (an error is logged)
    and must tolerate a second call."""

    def shutdown(self) -> None: ...
