"""The staged pipeline engine: declare with :class:`PipelineBuilder`, run a :class:`Pipeline`.

Mirrors ``spdl.pipeline``: code written for it keeps working after changing the import.
"""

import warnings

from . import defs as defs  # SPDL's declarative module: torch_spdl.pipeline.defs
from ._autotune import AutotuneConfig
from ._builder import PipelineBuilder
from ._compat import (
    cache_iterator,
    create_task,
    is_eof,
    is_epoch_end,
    iterate_in_subinterpreter,
    run_pipeline_in_subinterpreter,
)
from ._core.errors import PipelineFailure
from ._core.protocols import StoppablePart, StoppableSource
from ._core.stats import StageStats
from ._declare.config import (
    AggregateConfig,
    BuildOptions,
    DisaggregateConfig,
    PipelineSpec,
)
from ._plugins.background import BackgroundTask, BackgroundTaskFactory
from ._plugins.hooks import StageInfo, TaskHook, TaskPerfStats, TaskStatsHook
from ._plugins.priority import (
    PriorityExecutorEntrypoint,
    PriorityProcessPoolExecutor,
    PriorityThreadPoolExecutor,
)
from ._plugins.queues import AsyncQueue, QueuePerfStats, StatsQueue
from ._profile import ProfileHook, ProfileReport, ProfileResult, StageProfile, profile_pipeline
from ._run.assemble import build_pipeline
from ._run.pipeline import Pipeline
from ._run.trace_record import (
    PipelineTrace,
    TraceDecision,
    TraceSample,
    TraceSpan,
    export_chrome_trace,
    plot_trace,
)
from ._subprocess import SubprocessError, iterate_in_subprocess
from ._subprocess_pipeline import run_pipeline_in_subprocess

__all__ = [
    "AggregateConfig",
    "AsyncQueue",
    "AutotuneConfig",
    "BackgroundTask",
    "BackgroundTaskFactory",
    "BuildOptions",
    "DisaggregateConfig",
    "Pipeline",
    "PipelineBuilder",
    "PipelineSpec",
    "PipelineFailure",
    "PipelineTrace",
    "PriorityExecutorEntrypoint",
    "PriorityProcessPoolExecutor",
    "PriorityThreadPoolExecutor",
    "ProfileHook",
    "ProfileReport",
    "ProfileResult",
    "QueuePerfStats",
    "StageProfile",
    "StageInfo",
    "StageStats",
    "StatsQueue",
    "StoppablePart",
    "StoppableSource",
    "SubprocessError",
    "TaskHook",
    "TaskPerfStats",
    "TaskStatsHook",
    "TraceDecision",
    "TraceSample",
    "TraceSpan",
    "build_pipeline",
    "cache_iterator",
    "create_task",
    "export_chrome_trace",
    "is_eof",
    "is_epoch_end",
    "iterate_in_subinterpreter",
    "iterate_in_subprocess",
    "plot_trace",
    "profile_pipeline",
    "run_pipeline_in_subinterpreter",
    "run_pipeline_in_subprocess",
]


def __getattr__(name: str) -> object:
    # ``PipelineConfig`` here was the builder's declaration, now ``PipelineSpec``: the name
    # is SPDL's, for its own class (``defs.PipelineConfig``), so one name named two classes.
    if name == "PipelineConfig":
        warnings.warn(
            "torch_spdl.pipeline.PipelineConfig is now PipelineSpec (what "
            "PipelineBuilder.get_config() returns); SPDL's PipelineConfig is "
            "torch_spdl.pipeline.defs.PipelineConfig",
            DeprecationWarning,
            stacklevel=2,
        )
        return PipelineSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
