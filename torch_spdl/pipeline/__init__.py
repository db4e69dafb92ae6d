"""The staged pipeline engine: declare with :class:`PipelineBuilder`, run a :class:`Pipeline`.

Mirrors ``spdl.pipeline``: code written for it keeps working after changing the import.
"""

from ._builder import (
    AggregateConfig,
    DisaggregateConfig,
    PipeConfig,
    PipelineBuilder,
    PipelineConfig,
    build_pipeline,
)
from ._errors import PipelineFailure
from ._pipeline import Pipeline
from ._profile import ProfileReport, StageProfile, profile_pipeline
from ._stats import StageStats
from ._subprocess import SubprocessError, iterate_in_subprocess, run_pipeline_in_subprocess

__all__ = [
    "AggregateConfig",
    "DisaggregateConfig",
    "PipeConfig",
    "Pipeline",
    "PipelineBuilder",
    "PipelineConfig",
    "PipelineFailure",
    "ProfileReport",
    "StageProfile",
    "StageStats",
    "SubprocessError",
    "build_pipeline",
    "iterate_in_subprocess",
    "profile_pipeline",
    "run_pipeline_in_subprocess",
]
