"""Declaring a pipeline: ``PipelineBuilder`` records stage specs; ``build`` instantiates them.

A builder holds no threads and no state of a run, so one builder can be built any number of
times (each build is a fresh pipeline), pickled to a subprocess, or profiled stage by stage.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from . import _autotune_memory
from ._aggregate import AggregateStage, Aggregator, Collate, DisaggregateStage
from ._async_stage import AsyncStage
from ._autotune import DEFAULT_MAX_COROUTINES, DEFAULT_MAX_THREADS, DEFAULT_START, AutotuneConfig
from ._background import BackgroundTaskFactory
from ._channel import Channel
from ._failures import FailureBudget, MaxFailures, check_max_failures
from ._hooks import StageInfo, TaskHook, check_hooks
from ._nested import MergedSource, PathVariantsStage
from ._node import Node, OpStage
from ._ops import OpKind, classify_op, op_name
from ._pipeline import Pipeline
from ._placement import PlacementConfig, RegionConfig, fuse_regions
from ._queues import AsyncQueue, ObservedChannel, make_queue, queue_hooks_task
from ._region import RegionStage
from ._runtime import Runtime
from ._source import SourceNode
from ._thread_stage import ThreadStage

__all__ = [
    "PathVariantsConfig",
    "PipelineBuilder",
    "PipelineConfig",
    "PipeConfig",
    "AggregateConfig",
    "DisaggregateConfig",
    "build_pipeline",
]

T = TypeVar("T")
U = TypeVar("U")

OutputOrder = Literal["completion", "input"]
Concurrency = int | Literal["auto"]


@dataclass(frozen=True)
class PipeConfig:
    """One ``pipe`` stage as declared."""

    op: Any
    concurrency: Concurrency = 1
    executor: Executor | None = None
    output_order: OutputOrder = "completion"
    name: str | None = None
    max_failures: MaxFailures | None = None
    queue_size: int | None = None
    max_concurrency: int | None = None
    initial_concurrency: int | None = None
    # The stage id under which an autotuned stage's setting is kept for the next build of
    # this declaration (docs/autotune.md, "Keeping what was learnt").
    tune_key: int = field(default_factory=_autotune_memory.new_stage_id, compare=False)
    min_concurrency: int | None = None

    @property
    def kind(self) -> OpKind:
        return classify_op(self.op)[1]

    @property
    def auto(self) -> bool:
        """True when the autotuner chooses this stage's concurrency."""
        return self.concurrency == "auto"

    def concurrency_bound(self) -> int:
        """The declared concurrency, or the most an autotuned stage may grow to."""
        if not self.auto:
            return int(self.concurrency)
        if self.max_concurrency is not None:
            return self.max_concurrency
        return DEFAULT_MAX_COROUTINES if self.kind.is_async else DEFAULT_MAX_THREADS

    def label(self) -> str:
        return self.name or op_name(self.op)


@dataclass(frozen=True)
class AggregateConfig:
    """``aggregate(size, drop_last=...)`` as declared; ``aggregator`` is set (and ``size``
    is 0) for a custom :class:`~torch_spdl.pipeline.defs.Aggregator`."""

    size: int
    drop_last: bool = False
    aggregator: Aggregator | None = None

    def label(self) -> str:
        if self.aggregator is not None:
            return f"aggregate({type(self.aggregator).__name__})"
        return f"aggregate({self.size})"

    def make_aggregator(self) -> Aggregator:
        """A fresh aggregator for one build (a custom one is copied, state and all)."""
        if self.aggregator is not None:
            return copy.deepcopy(self.aggregator)
        return Collate(self.size)


@dataclass(frozen=True)
class DisaggregateConfig:
    """``disaggregate()`` as declared."""

    def label(self) -> str:
        return "disaggregate"


@dataclass(frozen=True)
class PathVariantsConfig:
    """``path_variants(router, paths)`` as declared: each item goes down the path whose
    index ``router(item)`` returns; the paths' outputs join into one stream."""

    router: Callable[[Any], Any]
    paths: tuple[tuple[Any, ...], ...]
    name: str | None = None

    def __post_init__(self) -> None:
        # ValueError for all of these, as SPDL raises (code may catch it)
        if not callable(self.router):
            raise ValueError(f"the router must be callable, got {self.router!r}")
        if not self.paths:
            raise ValueError("path_variants needs at least one path")
        for i, path in enumerate(self.paths):
            if not path:
                raise ValueError(f"path {i} of path_variants is empty")
            for stage in path:
                if not isinstance(
                    stage, (PipeConfig, AggregateConfig, DisaggregateConfig, PathVariantsConfig)
                ):
                    raise ValueError(
                        f"path {i} of path_variants holds {stage!r}: a path holds stages "
                        "(Pipe, Aggregate, Disaggregate, PathVariants)"
                    )

    def label(self) -> str:
        return self.name or f"path_variants({len(self.paths)})"


StageConfig = (
    PipeConfig | AggregateConfig | DisaggregateConfig | PathVariantsConfig | PlacementConfig
)


@dataclass
class PipelineConfig:
    """Everything ``build`` needs: the source, the stages in order, the sink size."""

    source: Any
    stages: list[StageConfig] = field(default_factory=list)
    buffer_size: int = 3
    continuous: bool = False  # add_source(continuous=True): one run per epoch, kept going


class PipelineBuilder(Generic[T, U]):
    """Declare a pipeline stage by stage, then :meth:`build` it.

    Every method returns the builder, so calls chain::

        pipeline = (
            PipelineBuilder()
            .add_source(range(100))
            .pipe(load, concurrency=16)
            .pipe(decode, concurrency=4, output_order="input")
            .aggregate(32)
            .pipe(collate)
            .add_sink(4)
            .build()
        )
    """

    def __init__(self) -> None:
        self._source: Any = None
        self._has_source = False
        self._continuous = False
        self._stages: list[StageConfig] = []
        self._buffer_size: int | None = None

    def add_source(
        self, source: Iterable[T] | AsyncIterable[T], *, continuous: bool = False
    ) -> PipelineBuilder[T, U]:
        """Set the iterable (or async iterable) that feeds the pipeline.

        A sync iterable runs on its own thread, so it may block (a ``Pipeline`` can be the
        source of another); an async iterable runs on the pipeline's event loop. To build
        more than once, pass a re-iterable (list, range, sampler), not a one-shot generator.

        Args:
            source: what feeds the pipeline.
            continuous: SPDL's multi-epoch mode: the pipeline iterates ``source`` again
                for each epoch, and each ``get_iterator()`` (or ``for`` loop) yields one
                epoch and ends at its boundary; ``aggregate`` emits (or with
                ``drop_last`` drops) its partial group at every boundary. The pipeline
                runs until ``stop()``. ``source`` must be re-iterable.
        """
        if self._has_source:
            raise ValueError("the source is already set")
        merged = getattr(source, "_merged_source", None)  # defs.Merge(...)
        if merged is not None:
            source = merged()
        if not isinstance(source, (Iterable, AsyncIterable)):
            raise TypeError(f"the source must be iterable or async iterable, got {source!r}")
        self._source = source
        self._has_source = True
        self._continuous = bool(continuous)
        return self

    def pipe(
        self,
        op: Callable[[Any], Any] | Any,
        /,
        *,
        concurrency: Concurrency = 1,
        executor: Executor | None = None,
        name: str | None = None,
        output_order: OutputOrder = "completion",
        max_failures: MaxFailures | None = None,
        queue_size: int | None = None,
        max_concurrency: int | None = None,
        initial_concurrency: int | None = None,
        min_concurrency: int | None = None,
    ) -> PipelineBuilder[T, U]:
        """Apply ``op`` to every item.

        ``op`` takes one argument and may be a function, an async function, a generator or
        an async generator (each yielded value becomes an item), a callable object, or a
        container with ``__getitem__``. A ``None`` result is dropped (as in SPDL).
        Sync ops run on ``concurrency`` worker threads of their own, or are handed to
        ``executor`` (a ``ThreadPoolExecutor`` for a dedicated thread, a
        ``ProcessPoolExecutor`` for processes) with at most ``concurrency`` items in flight.
        Async ops run on the pipeline's event loop as ``concurrency`` coroutines.
        ``output_order="input"`` keeps the input order; ``"completion"`` emits as finished.
        ``max_failures`` gives this stage a failure limit of its own, counted on its items
        alone, instead of sharing the one given to :meth:`build`: an ``int`` count (-1: no
        limit) or a ``fractions.Fraction`` rate in (0, 1] (see :meth:`build`).
        ``queue_size`` sets the capacity of this stage's input queue.
        ``concurrency="auto"`` lets the pipeline choose and adapt it while running, from 1
        up to ``max_concurrency`` (default 64 threads, 256 coroutines), starting at
        ``initial_concurrency`` (default: where the tuner left this stage in the last build
        of this builder in this process, else 4, so that its first items, which the tuner
        measures, come quickly), and never below ``min_concurrency`` (default 1: a floor
        that makes ``"auto"`` only ever add to a known-good value); see ``build``'s
        ``cpu_budget`` and ``memory_limit``. An ``int`` concurrency is always used exactly.
        """
        _, kind = classify_op(op)
        if concurrency != "auto" and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"concurrency must be a positive int or 'auto', got {concurrency!r}")
        for knob, value, role in (
            ("max_concurrency", max_concurrency, "bounds an autotuned stage"),
            ("initial_concurrency", initial_concurrency, "is where an autotuned stage starts"),
            ("min_concurrency", min_concurrency, "is the least an autotuned stage runs"),
        ):
            if value is None:
                continue
            if concurrency != "auto":
                raise ValueError(
                    f"{knob} {role}: it needs concurrency='auto', got concurrency={concurrency!r}"
                )
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{knob} must be a positive int, got {value!r}")
        if (
            min_concurrency is not None
            and max_concurrency is not None
            and isinstance(min_concurrency, int)
            and min_concurrency > max_concurrency
        ):
            raise ValueError(
                f"min_concurrency ({min_concurrency}) is above max_concurrency ({max_concurrency})"
            )
        if output_order not in ("completion", "input"):
            raise ValueError(f"output_order must be 'completion' or 'input', got {output_order!r}")
        if executor is not None and kind.is_async:
            raise ValueError(
                f"op {op_name(op)!r} is async: it runs on the pipeline's event loop, "
                "so it takes no executor"
            )
        if queue_size is not None and (not isinstance(queue_size, int) or queue_size < 1):
            raise ValueError(f"queue_size must be a positive int, got {queue_size!r}")
        if max_failures is not None:
            check_max_failures(max_failures, f"pipe({op_name(op)})")
        self._stages.append(
            PipeConfig(
                op,
                concurrency,
                executor,
                output_order,
                name,
                max_failures,
                queue_size,
                max_concurrency,
                initial_concurrency,
                min_concurrency=min_concurrency,
            )
        )
        return self

    def aggregate(
        self, num_items: int | Aggregator, /, *, drop_last: bool = False
    ) -> PipelineBuilder[T, U]:
        """Group every ``num_items`` items into a list (the last one may be shorter).

        Args:
            num_items: the size of each list, or an
                :class:`~torch_spdl.pipeline.defs.Aggregator` that decides the groups
                (each build uses a copy of it).
            drop_last: drop the shorter last list (for an aggregator: do not call its
                ``flush()``).
        """
        self._stages.append(aggregate_config(num_items, drop_last))
        return self

    def path_variants(
        self,
        router: Callable[[Any], Any],
        paths: Sequence[Sequence[Any]],
        name: str | None = None,
    ) -> PipelineBuilder[T, U]:
        """Send each item down one of several paths, then join the paths' outputs.

        Args:
            router: takes an item, returns the index of its path (a function or an async
                function); an error or an index out of range fails the item.
            paths: each a sequence of stages made by ``defs.Pipe``, ``defs.Aggregate``,
                ``defs.Disaggregate`` or ``defs.PathVariants``; each runs as a pipeline
                of its own, and their outputs come out in completion order.
            name: the stage's name in stats and errors.
        """
        self._stages.append(PathVariantsConfig(router, tuple(tuple(p) for p in paths), name))
        return self

    def to(self, target: Any, /) -> PipelineBuilder[T, U]:
        """Run the stages that follow on ``target``, until the next ``to()``.

        ``to(defs.ProcessPoolExecutorConfig(max_workers=n))`` opens a region: its stages
        run as one pipeline in each of ``n`` worker processes (started by ``fork`` on
        Linux, so their ops need not pickle), and only the region's inputs and outputs
        cross the process boundary, in chunks. ``to(defs.MAIN_PROCESS)`` closes it (a
        region left open runs to the end). Stages in a region take no executor.

        Args:
            target: a ``ProcessPoolExecutorConfig`` or ``MAIN_PROCESS``.
        """
        self._stages.append(PlacementConfig(target))
        return self

    def disaggregate(self) -> PipelineBuilder[T, U]:
        """Split each incoming list (any iterable) into separate items."""
        self._stages.append(DisaggregateConfig())
        return self

    def add_sink(self, buffer_size: int = 3) -> PipelineBuilder[T, U]:
        """Set the size of the output buffer the consumer reads from (0: unbounded)."""
        if self._buffer_size is not None:
            raise ValueError("the sink is already set")
        if not isinstance(buffer_size, int) or buffer_size < 0:
            raise ValueError(f"buffer_size must be a non-negative int, got {buffer_size!r}")
        self._buffer_size = buffer_size
        return self

    def get_config(self) -> PipelineConfig:
        """The declaration so far, as data (what ``profile_pipeline`` takes)."""
        if not self._has_source:
            raise RuntimeError("the source is not set: call add_source() first")
        buffer_size = 3 if self._buffer_size is None else self._buffer_size
        return PipelineConfig(self._source, list(self._stages), buffer_size, self._continuous)

    def build(
        self,
        *,
        num_threads: int | None = None,
        max_failures: MaxFailures = -1,
        report_stats_interval: float = -1,
        queue_size: int | None = None,
        cpu_budget: float | None = None,
        memory_limit: int | None = None,
        trace: bool = False,
        task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
        stage_id: int = 0,
        background_tasks: Sequence[BackgroundTaskFactory] = (),
        queue_class: type[AsyncQueue] | None = None,
        use_thread_output_queue: Any = None,
    ) -> Pipeline[U]:
        """Instantiate a fresh pipeline; nothing runs until it is started or iterated.

        ``num_threads``, when given, caps each sync stage's worker threads (stages never
        share threads). ``max_failures`` is how many failed items the pipeline may drop
        before it fails, counted across every stage that does not set its own in
        :meth:`pipe`: an ``int`` count (-1: no limit), or a ``fractions.Fraction`` rate in
        (0, 1], failures / items taken by those stages, checked once they have taken at
        least ``max(100, 1/rate)`` items (and when they end); a rate out of range is a
        ``ValueError`` here. ``report_stats_interval`` > 0 logs the stage
        table every that many seconds. ``queue_size`` overrides the capacity of the queues
        between stages (default: 64 samples, or 2 per worker for batches).
        ``cpu_budget`` (fraction of this machine's cores, default 0.4) and ``memory_limit``
        (resident bytes, default none) bound what stages with ``concurrency="auto"`` may grow
        to. ``trace=True`` records every item's time in every stage and the queue depths:
        read them with :meth:`Pipeline.trace`.
        ``task_hook_factory`` makes each stage's :class:`TaskHook` list from its
        :class:`StageInfo` (default: no hooks, and no cost); ``stage_id`` is passed to it.
        ``background_tasks`` are factories of :class:`BackgroundTask`: each runs on the
        pipeline's event loop from start to stop; a failure is logged, not raised.
        ``queue_class`` (a subclass of :class:`AsyncQueue`, such as :class:`StatsQueue`)
        observes every queue between stages: one instance per queue, its ``stage_hook()``
        held from start to stop, and every hand-off reported to it (see ``_queues.py``;
        default: none, and no cost). ``use_thread_output_queue`` is accepted for SPDL
        code: the consumer always reads the sink from its own thread here, which is what
        that option selects in SPDL.
        """
        return build_pipeline(
            self.get_config(),
            queue_class=queue_class,
            use_thread_output_queue=use_thread_output_queue,
            background_tasks=background_tasks,
            task_hook_factory=task_hook_factory,
            stage_id=stage_id,
            num_threads=num_threads,
            max_failures=max_failures,
            report_stats_interval=report_stats_interval,
            queue_size=queue_size,
            cpu_budget=cpu_budget,
            memory_limit=memory_limit,
            trace=trace,
        )

    def __repr__(self) -> str:
        stages = " -> ".join(s.label() for s in self._stages)
        return f"PipelineBuilder(source -> {stages or '(no stage)'} -> sink)"


def aggregate_config(num_items: int | Aggregator, drop_last: bool) -> AggregateConfig:
    """Check and record an ``aggregate`` stage."""
    if isinstance(num_items, Aggregator):
        return AggregateConfig(0, drop_last, num_items)
    if isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 1:
        raise ValueError(f"aggregate needs a positive int or an Aggregator, got {num_items!r}")
    return AggregateConfig(num_items, drop_last)


def queue_capacity(workers: int, batched: bool) -> int:
    """Capacity of the channel that feeds a stage of ``workers`` workers.

    Each worker should find its next item waiting, and between threads that share the GIL
    every hand-off that empties or fills a queue costs a thread switch (tens of us here), so
    queues of single samples get room for 64: a producer then runs a while before it must
    switch. Queues of batches (after ``aggregate``) hold far larger items and get just
    enough for every worker to have one ready. Either way the bound is a constant, so memory
    stays bounded whatever the source.
    """
    return max(2 * workers, 4) if batched else max(2 * workers, 64)


def build_pipeline(
    config: PipelineConfig,
    *,
    num_threads: int | None = None,
    max_failures: MaxFailures = -1,
    report_stats_interval: float = -1,
    queue_size: int | None = None,
    cpu_budget: float | None = None,
    memory_limit: int | None = None,
    trace: bool = False,
    autotune: AutotuneConfig | None = None,
    task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
    stage_id: int = 0,
    background_tasks: Sequence[BackgroundTaskFactory] = (),
    queue_class: type[AsyncQueue] | None = None,
    use_thread_output_queue: Any = None,
) -> Pipeline[Any]:
    """Instantiate the nodes and channels of ``config`` into a :class:`Pipeline`.

    The keywords are those of :meth:`PipelineBuilder.build`; ``autotune`` replaces the
    whole autotuner configuration (``cpu_budget`` and ``memory_limit`` are its two usual
    knobs).

    Args:
        config: the declaration: ``PipelineBuilder.get_config()``, or SPDL's
            :class:`torch_spdl.pipeline.defs.PipelineConfig`.
    """
    to_builder_config = getattr(config, "_to_builder_config", None)  # defs.PipelineConfig
    if to_builder_config is not None:
        config = to_builder_config()
    if config.continuous:  # one fresh run per epoch, behind one Pipeline
        options = {k: v for k, v in locals().items() if k not in ("config", "to_builder_config")}
        one_epoch = dataclasses.replace(config, continuous=False)
        first = build_pipeline(one_epoch, **options)
        first._continue_with(lambda: build_pipeline(one_epoch, **options))
        return first

    def make_inner(inner: Any) -> Pipeline[Any]:  # a pipeline inside this one
        return build_pipeline(
            inner,
            num_threads=num_threads,
            max_failures=max_failures,
            task_hook_factory=task_hook_factory,
            stage_id=stage_id,
            queue_class=queue_class,
        )

    if any(isinstance(s, PlacementConfig) for s in config.stages):
        config = dataclasses.replace(config, stages=fuse_regions(config.stages))
    if isinstance(config.source, MergedSource):
        config = dataclasses.replace(config, source=config.source.with_builder(make_inner))
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be positive, got {num_threads!r}")
    if queue_size is not None and queue_size < 1:
        raise ValueError(f"queue_size must be positive, got {queue_size!r}")
    check_max_failures(max_failures, "build")
    # The build-level limit is one budget shared by the stages without a limit of their
    # own; it reads their item counts only when an item fails.
    shared: list[Node] = []
    shared_budget = FailureBudget(max_failures, lambda: sum(n.invocations() for n in shared))
    if autotune is None:
        autotune = AutotuneConfig(memory_limit=memory_limit)
        if cpu_budget is not None:
            autotune = dataclasses.replace(autotune, cpu_budget=cpu_budget)
    workers = [_workers(s, num_threads) for s in config.stages]
    queues: list[AsyncQueue] = []

    def new_channel(capacity: int, name: str) -> Channel[Any]:
        if queue_class is None:
            return Channel(capacity, name=name)
        queues.append(make_queue(queue_class, name, capacity, report_stats_interval))
        return ObservedChannel(capacity, name, queues[-1])

    channels: list[Channel[Any]] = []
    depth = 0  # how many aggregates deep: > 0 means the items are batches
    for i, spec in enumerate(config.stages):
        own = spec.queue_size if isinstance(spec, PipeConfig) else None
        # an autotuned stage's queue is sized for a few workers, not its maximum: a queue of
        # batches sized for 64 workers would hold 128 batches
        sized = min(workers[i], 4) if isinstance(spec, PipeConfig) and spec.auto else workers[i]
        capacity = own or queue_size or queue_capacity(sized, batched=depth > 0)
        channels.append(new_channel(capacity, f"{i + 1}:{spec.label()} input"))
        if isinstance(spec, AggregateConfig):
            depth += 1
        elif isinstance(spec, DisaggregateConfig):
            depth = max(depth - 1, 0)
    channels.append(new_channel(config.buffer_size, "sink"))
    if queues:
        background_tasks = [*background_tasks, queue_hooks_task(queues)]

    nodes: list[Node] = [SourceNode(config.source, channels[0])]
    for i, spec in enumerate(config.stages):
        name = f"{i + 1}:{spec.label()}"
        inbox, outbox = channels[i], channels[i + 1]
        hooks: list[TaskHook] = []
        if task_hook_factory is not None:
            hooks = check_hooks(task_hook_factory(StageInfo(name, i + 1, stage_id)), name)
        node: Node
        if isinstance(spec, RegionConfig):
            region_options = {"num_threads": num_threads, "max_failures": max_failures}
            node = RegionStage(
                name,
                list(spec.stages),
                spec.executor,
                region_options,
                inbox,
                outbox,
                _build_region,
            )
        elif isinstance(spec, PathVariantsConfig):
            makers = [
                lambda src, p=path: make_inner(PipelineConfig(src, list(p), 2))
                for path in spec.paths
            ]
            node = PathVariantsStage(name, spec.router, makers, inbox, outbox, budget=shared_budget)
            shared.append(node)
        elif isinstance(spec, AggregateConfig):
            aggregator = spec.make_aggregator()
            node = AggregateStage(name, aggregator, spec.drop_last, inbox, outbox, hooks)
        elif isinstance(spec, DisaggregateConfig):
            node = DisaggregateStage(name, inbox, outbox, hooks)
        elif isinstance(spec, PipeConfig):
            node = _op_stage(name, spec, workers[i], inbox, outbox, hooks, shared_budget)
            if spec.max_failures is None:
                shared.append(node)
        else:  # fuse_regions turned every placement into a RegionConfig
            raise AssertionError(f"unexpected stage declaration {spec!r}")
        nodes.append(node)
    runtime = Runtime(
        nodes,
        channels,
        report_stats_interval=report_stats_interval,
        autotune=autotune,
        trace=trace,
        background_tasks=background_tasks,
    )
    return Pipeline(runtime, channels[-1], description=_describe(config))


def _build_region(source: Iterable[Any], stages: list[Any], options: dict[str, Any]) -> Any:
    """A region's stages as a pipeline of their own (run in each of its worker processes)."""
    return build_pipeline(PipelineConfig(source, stages, 0), **options)


def _op_stage(
    name: str,
    spec: PipeConfig,
    workers: int,
    inbox: Channel[Any],
    outbox: Channel[Any],
    hooks: list[TaskHook],
    shared_budget: FailureBudget,
) -> OpStage:
    """The node of a ``pipe`` stage: threads for a sync op, coroutines for an async one."""
    op, kind = classify_op(spec.op)
    own_limit = spec.max_failures is not None
    floor = min(spec.min_concurrency or 1, workers)
    start = spec.initial_concurrency or _autotune_memory.recall(spec.tune_key) or DEFAULT_START
    ordered = spec.output_order == "input"
    initial = max(floor, min(start, workers)) if spec.auto else workers
    max_failures = spec.max_failures if spec.max_failures is not None else -1
    budget = None if own_limit else shared_budget
    max_workers = workers if spec.auto else None
    tune_key = spec.tune_key if spec.auto else None
    if kind.is_async:
        return AsyncStage(
            name,
            op,
            kind,
            inbox,
            outbox,
            workers=initial,
            ordered=ordered,
            max_failures=max_failures,
            max_workers=max_workers,
            budget=budget,
            hooks=hooks,
            tune_key=tune_key,
            min_workers=floor,
        )
    return ThreadStage(
        name,
        op,
        kind,
        inbox,
        outbox,
        workers=initial,
        ordered=ordered,
        max_failures=max_failures,
        max_workers=max_workers,
        budget=budget,
        hooks=hooks,
        tune_key=tune_key,
        min_workers=floor,
        executor=spec.executor,
    )


def _workers(spec: StageConfig, num_threads: int | None) -> int:
    """A stage's worker count, or for an autotuned stage the most it may grow to."""
    if not isinstance(spec, PipeConfig):
        return 1
    bound = spec.concurrency_bound()
    if spec.executor is None and not spec.kind.is_async and num_threads is not None:
        return min(bound, num_threads)
    return bound


def _describe(config: PipelineConfig) -> str:
    parts = ["source"]
    for spec in config.stages:
        if isinstance(spec, PipeConfig):
            conc = f"auto<={spec.concurrency_bound()}" if spec.auto else spec.concurrency
            parts.append(f"{spec.label()}[{conc}]")
        else:
            parts.append(spec.label())
    parts.append(f"sink({config.buffer_size})")
    return " -> ".join(parts)
