"""What a pipeline is, as data: the stage declarations, the pipeline's, and the build options.

The pipeline's is :class:`PipelineSpec`, not ``PipelineConfig``: that name is SPDL's, for
its own declaration (``defs.PipelineConfig``), which is turned into a ``PipelineSpec``.

Everything here is a frozen description, with no thread, channel or stage of a run: the
fluent :class:`~..PipelineBuilder` records these, SPDL's ``defs`` module makes them
directly, ``profile_pipeline`` and the subprocess runner take them apart, and
``_run/assemble.py`` turns them into a running pipeline. :class:`BuildOptions` holds the options
of one build (``build``'s keywords), in one place for every entry point that builds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .._autotune.memory import new_stage_id
from .._autotune.vocabulary import DEFAULT_MAX_COROUTINES, DEFAULT_MAX_THREADS, AutotuneConfig
from .failures import MaxFailures, check_max_failures
from .grouping import Aggregator, Collate
from .ops import OpKind, classify_op, op_name
from .placement import PlacementConfig

if TYPE_CHECKING:
    from .._core.protocols import StoppablePart
    from .._plugins.background import BackgroundTaskFactory
    from .._plugins.hooks import StageInfo, TaskHook
    from .._plugins.queues import AsyncQueue

__all__ = [
    "AggregateConfig",
    "BuildOptions",
    "Concurrency",
    "DisaggregateConfig",
    "OutputOrder",
    "PathVariantsConfig",
    "PipeConfig",
    "PipelineSpec",
    "StageConfig",
    "aggregate_config",
]

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
    tune_key: int = field(default_factory=new_stage_id, compare=False)
    min_concurrency: int | None = None

    @property
    def kind(self) -> OpKind:
        return classify_op(self.op)[1]

    @property
    def one_to_one(self) -> bool:
        """True when the op makes exactly one item per input (a function, not a generator)."""
        return self.kind in (OpKind.FUNC, OpKind.ASYNC_FUNC)

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


def aggregate_config(num_items: int | Aggregator, *, drop_last: bool) -> AggregateConfig:
    """Check and record an ``aggregate`` stage."""
    if isinstance(num_items, Aggregator):
        return AggregateConfig(0, drop_last, num_items)
    if isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 1:
        raise ValueError(f"aggregate needs a positive int or an Aggregator, got {num_items!r}")
    return AggregateConfig(num_items, drop_last)


@dataclass(frozen=True)
class BuildOptions:
    """The options of one build: the keywords of :meth:`PipelineBuilder.build
    <torch_spdl.pipeline.PipelineBuilder.build>` (see there for each), plus ``autotune``.

    ``PipelineBuilder.build``, ``build_pipeline``, ``PipelineDataset`` and
    ``run_pipeline_in_subprocess`` all make one of these from their keywords; each build
    reads its options from it alone. ``autotune`` replaces the whole autotuner
    configuration (``cpu_budget`` and ``memory_limit`` are its two usual knobs).

    Args:
        num_threads: the most worker threads of each sync stage.
        max_failures: failed items the pipeline may drop (count or rate).
        report_stats_interval: log the stage table every that many seconds (> 0).
        queue_size: the capacity of the queues between stages.
        cpu_budget: what autotuned stages may grow to, as a fraction of the cores.
        memory_limit: the resident bytes autotuned stages may grow to.
        trace: record every item's time in every stage.
        autotune: the autotuner's whole configuration (overrides the two above).
        task_hook_factory: makes each stage's task hooks from its ``StageInfo``.
        stage_id: passed to ``task_hook_factory``.
        background_tasks: factories of tasks run on the event loop from start to stop.
        queue_class: an ``AsyncQueue`` subclass observing every queue.
        use_thread_output_queue: accepted for SPDL code (no effect here).
    """

    num_threads: int | None = None
    max_failures: MaxFailures = -1
    report_stats_interval: float = -1
    queue_size: int | None = None
    cpu_budget: float | None = None
    memory_limit: int | None = None
    trace: bool = False
    autotune: AutotuneConfig | None = None
    task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None
    stage_id: int = 0
    background_tasks: Sequence[BackgroundTaskFactory] = ()
    queue_class: type[AsyncQueue] | None = None
    use_thread_output_queue: Any = None

    def check(self) -> None:
        """Raise ``ValueError`` for an option out of range."""
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be positive, got {self.num_threads!r}")
        if self.queue_size is not None and self.queue_size < 1:
            raise ValueError(f"queue_size must be positive, got {self.queue_size!r}")
        check_max_failures(self.max_failures, "build")

    def autotune_config(self) -> AutotuneConfig:
        """The autotuner's configuration: ``autotune``, or the defaults with
        ``cpu_budget`` and ``memory_limit``."""
        if self.autotune is not None:
            return self.autotune
        if self.cpu_budget is None:
            return AutotuneConfig(memory_limit=self.memory_limit)
        return AutotuneConfig(cpu_budget=self.cpu_budget, memory_limit=self.memory_limit)

    def for_nested(self) -> BuildOptions:
        """The options of a pipeline built inside this one (a ``path_variants`` path, a
        ``Merge`` input): the same workers, failure limit, hooks and queues, and nothing
        that belongs to the whole run (stats, tracing, tuning, background tasks)."""
        return BuildOptions(
            num_threads=self.num_threads,
            max_failures=self.max_failures,
            task_hook_factory=self.task_hook_factory,
            stage_id=self.stage_id,
            queue_class=self.queue_class,
        )

    def for_region(self) -> BuildOptions:
        """The options of a ``to()`` region's pipeline in each of its worker processes."""
        return BuildOptions(num_threads=self.num_threads, max_failures=self.max_failures)


@dataclass
class PipelineSpec:
    """Everything ``build`` needs: the source, the stages in order, the sink size,
    and the parts the run owns besides its stages (``add_stoppable``).

    What ``PipelineBuilder.get_config()`` returns. SPDL's ``defs.PipelineConfig`` (another
    class, SPDL's shape: ``src``, ``pipes``, ``sink``) is turned into one of these to build.
    """

    source: Any
    stages: list[StageConfig] = field(default_factory=list)
    buffer_size: int = 3
    continuous: bool = False  # add_source(continuous=True): one run per epoch, kept going
    parts: list[StoppablePart] = field(default_factory=list)
