"""The staged pipeline engine: declare with :class:`PipelineBuilder`, run a :class:`Pipeline`.

Mirrors ``spdl.pipeline``: code written for it keeps working after changing the import.

Each name is imported from its module on first use (PEP 562), so that what imports one
name loads only what that name needs: the DataLoader's default epoch (worker processes
that ``next()`` feeds) names ``PipelineFailure`` and ``StoppablePart`` and never declares
a pipeline, and a training script that swaps its import then does not load the engine
(2 MiB of a process that every worker shares, and 30 ms of its start; docs/dataloader.md,
"Memory").
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from ._core.parts import OwnedParts
    from ._core.protocols import StoppablePart, StoppableSource
    from ._core.stats import StageStats
    from ._declare.config import (
        AggregateConfig,
        BuildOptions,
        DisaggregateConfig,
        PipelineSpec,
    )
    from ._declare.placement import RayActors
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

# Where each public name lives: imported from there on first use.
_WHERE = {
    "AutotuneConfig": "._autotune",
    "PipelineBuilder": "._builder",
    "cache_iterator": "._compat",
    "create_task": "._compat",
    "is_eof": "._compat",
    "is_epoch_end": "._compat",
    "iterate_in_subinterpreter": "._compat",
    "run_pipeline_in_subinterpreter": "._compat",
    "PipelineFailure": "._core.errors",
    "OwnedParts": "._core.parts",
    "StoppablePart": "._core.protocols",
    "StoppableSource": "._core.protocols",
    "StageStats": "._core.stats",
    "AggregateConfig": "._declare.config",
    "BuildOptions": "._declare.config",
    "DisaggregateConfig": "._declare.config",
    "PipelineSpec": "._declare.config",
    "RayActors": "._declare.placement",
    "BackgroundTask": "._plugins.background",
    "BackgroundTaskFactory": "._plugins.background",
    "StageInfo": "._plugins.hooks",
    "TaskHook": "._plugins.hooks",
    "TaskPerfStats": "._plugins.hooks",
    "TaskStatsHook": "._plugins.hooks",
    "PriorityExecutorEntrypoint": "._plugins.priority",
    "PriorityProcessPoolExecutor": "._plugins.priority",
    "PriorityThreadPoolExecutor": "._plugins.priority",
    "AsyncQueue": "._plugins.queues",
    "QueuePerfStats": "._plugins.queues",
    "StatsQueue": "._plugins.queues",
    "ProfileHook": "._profile",
    "ProfileReport": "._profile",
    "ProfileResult": "._profile",
    "StageProfile": "._profile",
    "profile_pipeline": "._profile",
    "build_pipeline": "._run.assemble",
    "Pipeline": "._run.pipeline",
    "PipelineTrace": "._run.trace_record",
    "TraceDecision": "._run.trace_record",
    "TraceSample": "._run.trace_record",
    "TraceSpan": "._run.trace_record",
    "export_chrome_trace": "._run.trace_record",
    "plot_trace": "._run.trace_record",
    "SubprocessError": "._subprocess",
    "iterate_in_subprocess": "._subprocess",
    "run_pipeline_in_subprocess": "._subprocess_pipeline",
}

__all__ = [
    "AggregateConfig",
    "AsyncQueue",
    "AutotuneConfig",
    "BackgroundTask",
    "BackgroundTaskFactory",
    "BuildOptions",
    "DisaggregateConfig",
    "OwnedParts",
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
    "RayActors",
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


def __getattr__(name: str) -> Any:
    if name == "defs":  # SPDL's declarative module: torch_spdl.pipeline.defs
        return importlib.import_module(".defs", __name__)
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value  # found here from now on, without this function
        return value
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
        return __getattr__("PipelineSpec")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "defs"})
