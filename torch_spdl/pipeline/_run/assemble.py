"""The build: turn a declaration into nodes and channels, and hand them to a runtime.

``build(config, options)`` is the one place where a :class:`PipelineSpec` (the builder's,
``_declare/config.py``) meets the engine: it fuses ``to()`` regions, sizes the channel in
front of each stage (:func:`queue_capacity`), makes one node per stage (threads for a sync
op, coroutines for an async one, the regrouping and nested stages), shares the build-level
failure budget among the stages without one of their own, and wraps it all in a
:class:`Pipeline`. ``build_pipeline`` is its public face, with ``build``'s keywords. Each
call makes a fresh pipeline; nothing here keeps state between builds except what the
autotuner remembers (``_autotune/memory.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._autotune import DEFAULT_START, DEFAULT_START_COROUTINES, AutotuneConfig
from .._autotune.memory import recall
from .._declare.config import (
    AggregateConfig,
    BuildOptions,
    DisaggregateConfig,
    PathVariantsConfig,
    PipeConfig,
    PipelineSpec,
    StageConfig,
)
from .._declare.failures import FailureLimit, MaxFailures
from .._declare.ops import classify_op
from .._declare.placement import PlacementConfig, RayActors, RegionConfig, fuse_regions
from .._plugins.background import BackgroundTaskFactory
from .._plugins.hooks import StageInfo, TaskHook, check_hooks
from .._plugins.queues import AsyncQueue, ObservedChannel, make_queue, queue_hooks_task
from .._stage_kinds.aggregate import AggregateStage, DisaggregateStage
from .._stage_kinds.async_stage import AsyncStage
from .._stage_kinds.nested import MergedSource, PathVariantsStage
from .._stage_kinds.node import Node
from .._stage_kinds.op_stage import OpStage
from .._stage_kinds.ray_region import RayRegionStage
from .._stage_kinds.region import RegionStage
from .._stage_kinds.source import SourceNode
from .._stage_kinds.source import on_loop as source_on_loop
from .._stage_kinds.thread_stage import ThreadStage
from .._wire.channel import Channel
from .pipeline import Pipeline
from .runtime import Runtime

__all__ = ["build", "build_pipeline", "queue_capacity"]

# Numbers the pipelines built in this process, for the names a queue_class observer gets
# ("pipeline:stage:name", SPDL's form, which its users parse).
_pipeline_ids = itertools.count()


def queue_capacity(workers: int, *, batched: bool) -> int:
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
    config: PipelineSpec | Any,
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
    options: BuildOptions | None = None,
) -> Pipeline[Any]:
    """Instantiate the nodes and channels of ``config`` into a :class:`Pipeline`.

    The keywords are those of :meth:`PipelineBuilder.build` (see there for each), with
    ``autotune`` besides; or pass them all at once as ``options``.

    Args:
        config: the declaration: ``PipelineBuilder.get_config()``, or SPDL's
            :class:`torch_spdl.pipeline.defs.PipelineConfig`.
        num_threads: the most worker threads of each sync stage.
        max_failures: failed items the pipeline may drop before it fails: an ``int``
            count (-1: no limit) or a ``fractions.Fraction`` rate.
        report_stats_interval: log the stage table every that many seconds (> 0).
        queue_size: the capacity of the queues between stages.
        cpu_budget: the fraction of the cores autotuned stages may use (default 0.4).
        memory_limit: the resident bytes autotuned stages may grow to (default: none).
        trace: record every item's time in every stage (read with ``Pipeline.trace()``).
        autotune: the autotuner's whole configuration (``cpu_budget`` and
            ``memory_limit`` are its two usual knobs; this replaces both).
        task_hook_factory: makes each stage's :class:`TaskHook` list from its
            :class:`StageInfo`.
        stage_id: passed to ``task_hook_factory``.
        background_tasks: factories of tasks run on the event loop from start to stop.
        queue_class: an :class:`AsyncQueue` subclass that observes every queue.
        use_thread_output_queue: accepted for SPDL code (no effect here).
        options: all of the above as one :class:`BuildOptions` (then pass no other).
    """
    given = BuildOptions(
        num_threads=num_threads,
        max_failures=max_failures,
        report_stats_interval=report_stats_interval,
        queue_size=queue_size,
        cpu_budget=cpu_budget,
        memory_limit=memory_limit,
        trace=trace,
        autotune=autotune,
        task_hook_factory=task_hook_factory,
        stage_id=stage_id,
        background_tasks=background_tasks,
        queue_class=queue_class,
        use_thread_output_queue=use_thread_output_queue,
    )
    if options is None:
        options = given
    elif given != BuildOptions():
        raise TypeError("build_pipeline takes options=BuildOptions(...) or keywords, not both")
    return build(config, options)


def build(config: PipelineSpec | Any, options: BuildOptions) -> Pipeline[Any]:
    """Instantiate ``config`` with ``options``: what every entry point that builds calls."""
    to_builder_config = getattr(config, "_to_builder_config", None)  # defs.PipelineConfig
    if to_builder_config is not None:
        config = to_builder_config()
    if not config.continuous:
        return Pipeline(*_Assembly(config, options).run(), description=_describe(config))
    one_epoch = dataclasses.replace(config, continuous=False)  # one fresh run per epoch

    def renew() -> tuple[Runtime, Channel[Any]]:
        return _Assembly(one_epoch, options).run()

    runtime, sink = renew()
    return Pipeline(runtime, sink, description=_describe(one_epoch), renew=renew)


def _build_nested(options: BuildOptions, inner: PipelineSpec) -> Pipeline[Any]:
    """A pipeline inside another (a ``Merge`` input, a ``path_variants`` path)."""
    return build(inner, options.for_nested())


def _path_variant(
    inner: Callable[[PipelineSpec], Pipeline[Any]], path: Sequence[Any], source: Any
) -> Pipeline[Any]:
    """The pipeline of one ``path_variants`` path, fed by ``source``."""
    return inner(PipelineSpec(source, list(path), 2))


class _Assembly:
    """One build of one run, in named steps: the declaration resolved (regions fused,
    ``Merge`` inputs given their builder), the channels sized, the nodes made, the runtime
    that owns them. The build-level failure limit is one budget shared by the stages
    without a limit of their own; it reads their item counts only when an item fails."""

    def __init__(self, config: PipelineSpec, options: BuildOptions) -> None:
        # Nothing the pipeline keeps (its nodes, the budget they share, a merged source)
        # refers back to this assembly, and the budget holds its stages weakly: a cycle
        # would keep the declaration, and the parts it owns (a DataLoader's worker
        # processes), alive after the pipeline is gone, until the cycle collector ran.
        self.options = options
        self.inner: Callable[[PipelineSpec], Pipeline[Any]] = functools.partial(
            _build_nested, options
        )
        if any(isinstance(s, PlacementConfig) for s in config.stages):
            config = dataclasses.replace(config, stages=fuse_regions(config.stages))
        if isinstance(config.source, MergedSource):
            config = dataclasses.replace(config, source=config.source.with_builder(self.inner))
        options.check()
        self.config = config
        shared: weakref.WeakSet[Node] = weakref.WeakSet()  # the stages sharing the budget
        self.shared = shared
        self.budget = FailureLimit(
            options.max_failures, lambda: sum(n.invocations() for n in list(shared))
        )
        self.workers = [_workers(s, options.num_threads) for s in config.stages]
        self.queues: list[AsyncQueue] = []  # queue_class observers, one per channel
        self.pipeline_id = next(_pipeline_ids)

    def run(self) -> tuple[Runtime, Channel[Any]]:
        """The runtime of this run, with its nodes and channels, and the sink."""
        channels = self.channels()
        nodes: list[Node] = [SourceNode(self.config.source, channels[0])]
        for i, spec in enumerate(self.config.stages):
            nodes.append(self.node(i, spec, channels[i], channels[i + 1]))
        background_tasks = list(self.options.background_tasks)
        if self.queues:
            background_tasks.append(queue_hooks_task(self.queues))
        runtime = Runtime(
            nodes,
            channels,
            report_stats_interval=self.options.report_stats_interval,
            autotune=self.options.autotune_config(),
            trace=self.options.trace,
            background_tasks=background_tasks,
            parts=self.config.parts,
        )
        return runtime, channels[-1]

    def channels(self) -> list[Channel[Any]]:
        """The channel in front of each stage, and the sink.

        A channel between the event loop and a thread refills in bursts: its blocked
        producers are woken once it is half empty, as many as fit at once, not one per
        get. Each wake crosses threads: the loop handing the GIL to the source's thread
        (which stalls every coroutine), or a thread's ``call_soon_threadsafe`` waking the
        loop (a system call and a GIL hand-off). 256 coroutines sleeping 5 ms paid one per
        item into the sink; in bursts their process CPU per item fell from 12-13 to 10-12
        us, and from 23-25 to 20-21 us when the kernel spreads the threads over 2 cores.
        Between threads the wakes stay one per get: worker threads share the GIL with their
        producer anyway, and a producer kept waiting there risks starving them.
        """
        stages, options = self.config.stages, self.options
        looped = [source_on_loop(self.config.source)]
        looped += [isinstance(s, PipeConfig) and s.kind.is_async for s in stages]
        looped.append(False)  # the consumer is a thread
        channels: list[Channel[Any]] = []
        depth = 0  # how many aggregates deep: > 0 means the items are batches
        for i, spec in enumerate(stages):
            own = spec.queue_size if isinstance(spec, PipeConfig) else None
            # An autotuned stage's queue is sized for a few workers, not its maximum: a
            # queue of batches sized for 64 workers would hold 128 batches. The source's
            # queue is the exception: it holds keys, and a source woken every few items (a
            # queue sized for 4 workers refills 32 at a time) costs a coroutine stage a GIL
            # hand-off per 32 items where a fixed stage of 256 paid one per 256 (the source
            # thread spent 1.2 us of CPU per item against 0.4).
            few = isinstance(spec, PipeConfig) and spec.auto and i > 0
            sized = min(self.workers[i], 4) if few else self.workers[i]
            capacity = own or options.queue_size or queue_capacity(sized, batched=depth > 0)
            refill = capacity // 2 if looped[i] != looped[i + 1] else None
            channels.append(self.channel(capacity, f"{i + 1}:{spec.label()} input", i, refill))
            if isinstance(spec, AggregateConfig):
                depth += 1
            elif isinstance(spec, DisaggregateConfig):
                depth = max(depth - 1, 0)
        size, last = self.config.buffer_size, len(stages)
        refill = size // 2 if looped[last] != looped[last + 1] else None
        channels.append(self.channel(size, "sink", last, refill))
        return channels

    def channel(self, capacity: int, name: str, index: int, refill_at: int | None) -> Channel[Any]:
        """The channel out of node ``index`` (0: the source); an observer queue, if asked,
        is named as SPDL names the queue out of a stage: ``pipeline:stage_id+index:name``."""
        options = self.options
        if options.queue_class is None:
            return Channel(capacity, name=name, refill_at=refill_at)
        writer = self.config.stages[index - 1].label() if index else "src"
        qname = f"{self.pipeline_id}:{options.stage_id + index}:{writer}"
        queue = make_queue(options.queue_class, qname, capacity, options.report_stats_interval)
        self.queues.append(queue)
        return ObservedChannel(capacity, name, queue, refill_at=refill_at)

    def node(self, i: int, spec: StageConfig, inbox: Channel[Any], outbox: Channel[Any]) -> Node:
        """The node of stage ``i``; those without a limit of their own share the budget."""
        name, budget = f"{i + 1}:{spec.label()}", self.budget
        hooks = self.hooks(i, name)  # asked of the factory for every stage, as in SPDL
        node: Node
        if isinstance(spec, RegionConfig):
            options, stages, target = self.options.for_region(), list(spec.stages), spec.executor
            if not isinstance(target, RayActors):
                return RegionStage(name, stages, target, options, inbox, outbox, _build_region)
            node = RayRegionStage(
                name, stages, target, options, inbox, outbox, _build_region, budget
            )  # its actors' failed items count against the build's budget
        elif isinstance(spec, PathVariantsConfig):
            makers = [functools.partial(_path_variant, self.inner, path) for path in spec.paths]
            node = PathVariantsStage(name, spec.router, makers, inbox, outbox, budget=budget)
        elif isinstance(spec, AggregateConfig):
            aggregator = spec.make_aggregator()
            node = AggregateStage(
                name, aggregator, inbox, outbox, hooks, drop_last=spec.drop_last, budget=budget
            )
        elif isinstance(spec, DisaggregateConfig):
            node = DisaggregateStage(name, inbox, outbox, hooks, budget=budget)
        elif isinstance(spec, PipeConfig):
            node = _op_stage(name, spec, self.workers[i], inbox, outbox, hooks, budget)
            if spec.max_failures is not None:
                return node
        else:  # fuse_regions turned every placement into a RegionConfig
            raise AssertionError(f"unexpected stage declaration {spec!r}")
        self.shared.add(node)
        return node

    def hooks(self, i: int, name: str) -> list[TaskHook]:
        """Stage ``i``'s task hooks, from the build's ``task_hook_factory`` (none without)."""
        factory = self.options.task_hook_factory
        if factory is None:
            return []
        info = StageInfo(name, i + 1, self.options.stage_id, pipeline_id=self.pipeline_id)
        return check_hooks(factory(info), name)


def _build_region(source: Iterable[Any], stages: list[Any], options: BuildOptions) -> Pipeline[Any]:
    """A region's stages as a pipeline of their own (run in each of its worker processes)."""
    return build(PipelineSpec(source, stages, 0), options)


def _op_stage(
    name: str,
    spec: PipeConfig,
    workers: int,
    inbox: Channel[Any],
    outbox: Channel[Any],
    hooks: list[TaskHook],
    shared_budget: FailureLimit,
) -> OpStage:
    """The node of a ``pipe`` stage: threads for a sync op, coroutines for an async one."""
    op, kind = classify_op(spec.op)
    own_limit = spec.max_failures is not None
    floor = min(spec.min_concurrency or 1, workers)
    default = DEFAULT_START_COROUTINES if kind.is_async else DEFAULT_START
    start = spec.initial_concurrency or recall(spec.tune_key) or default
    ordered = spec.output_order == "input"
    initial = max(floor, min(start, workers)) if spec.auto else workers
    max_failures = spec.max_failures if spec.max_failures is not None else -1
    budget = None if own_limit else shared_budget
    max_workers = workers if spec.auto else None
    tune_key = spec.tune_key if spec.auto else None
    common: dict[str, Any] = {
        "workers": initial,
        "ordered": ordered,
        "max_failures": max_failures,
        "max_workers": max_workers,
        "budget": budget,
        "hooks": hooks,
        "tune_key": tune_key,
        "min_workers": floor,
    }
    if kind.is_async:
        return AsyncStage(name, op, kind, inbox, outbox, **common)
    return ThreadStage(name, op, kind, inbox, outbox, **common, executor=spec.executor)


def _workers(spec: StageConfig, num_threads: int | None) -> int:
    """A stage's worker count, or for an autotuned stage the most it may grow to."""
    if not isinstance(spec, PipeConfig):
        return 1
    bound = spec.concurrency_bound()
    if spec.executor is None and not spec.kind.is_async and num_threads is not None:
        return min(bound, num_threads)
    return bound


def _describe(config: PipelineSpec) -> str:
    parts = ["source"]
    for spec in config.stages:
        if isinstance(spec, PipeConfig):
            conc = f"auto<={spec.concurrency_bound()}" if spec.auto else spec.concurrency
            parts.append(f"{spec.label()}[{conc}]")
        else:
            parts.append(spec.label())
    parts.append(f"sink({config.buffer_size})")
    return " -> ".join(parts)
