"""SPDL's declarative building blocks: describe a pipeline as data, then ``build_pipeline``.

Code written for ``spdl.pipeline.defs`` builds a :class:`PipelineConfig` from a
:class:`SourceConfig`, a list of stages made by :func:`Pipe`, :func:`Aggregate` and
:func:`Disaggregate`, and a :class:`SinkConfig`, and passes it to
:func:`torch_spdl.pipeline.build_pipeline`. These are thin declarations over the ones
:class:`~torch_spdl.pipeline.PipelineBuilder` records (the stage configs are the same
classes), so both ways of declaring share one validation and one build.

Execution regions: a :class:`PlacementConfig` among the stages (what
``PipelineBuilder.to`` records) with a :class:`ProcessPoolExecutorConfig` target runs the
stages up to the next one (``MAIN_PROCESS``) in worker processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ._builder import PipelineBuilder
from ._declare import placement as _placement
from ._declare.config import (
    AggregateConfig,
    DisaggregateConfig,
    PathVariantsConfig,
    PipeConfig,
    aggregate_config,
)
from ._declare.config import PipelineSpec as _BuilderConfig
from ._declare.failures import MaxFailures
from ._declare.grouping import Aggregator, Collate
from ._stage_kinds.nested import MergedSource

__all__ = [
    "MAIN_PROCESS",
    "Aggregate",
    "AggregateConfig",
    "Aggregator",
    "Collate",
    "Disaggregate",
    "DisaggregateConfig",
    "ExecutorConfig",
    "InterpreterPoolExecutorConfig",
    "Merge",
    "MergeConfig",
    "PathVariants",
    "PathVariantsConfig",
    "Pipe",
    "PipeConfig",
    "PipelineConfig",
    "PlacementConfig",
    "ProcessPoolExecutorConfig",
    "SinkConfig",
    "SourceConfig",
]


@dataclass(frozen=True)
class SourceConfig:
    """The source of a pipeline: an iterable or an async iterable.

    Args:
        source: what feeds the pipeline (see ``PipelineBuilder.add_source``).
        continuous: iterate it again for every epoch (``add_source(continuous=True)``).
    """

    source: Iterable[Any] | AsyncIterable[Any]
    continuous: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.source, (Iterable, AsyncIterable)):
            raise TypeError(f"the source must be iterable or async iterable, got {self.source!r}")


@dataclass(frozen=True)
class SinkConfig:
    """The output buffer the consumer reads from.

    Args:
        buffer_size: how many items it holds (0: unbounded); see ``add_sink``.
    """

    buffer_size: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.buffer_size, int) or self.buffer_size < 0:
            raise ValueError(f"buffer_size must be a non-negative int, got {self.buffer_size!r}")


@dataclass(frozen=True)
class MergeConfig:
    r"""Several pipelines feeding one: the ``src`` of a :class:`PipelineConfig` (or the
    source given to ``PipelineBuilder.add_source``). Made by :func:`Merge`.

    Args:
        pipeline_configs: the pipelines whose outputs are merged (at least one).
        op: an async function ``op(info, input_queues, output_queue)`` (``info``: the
            merge's ``StageInfo``, whose ``str()`` is its name) that moves items
            from the input ``asyncio.Queue`` objects (each ends with an item for which
            ``is_eof`` is true) to the output queue; default: every item, as they come.
    """

    pipeline_configs: tuple[Any, ...]
    op: Any = None

    def __post_init__(self) -> None:
        if len(self.pipeline_configs) < 1:
            raise ValueError("Merge needs at least one upstream pipeline config")

    def _merged_source(self) -> MergedSource:
        configs = [getattr(c, "_to_builder_config", lambda c=c: c)() for c in self.pipeline_configs]
        return MergedSource(configs, self.op)


def Merge(  # noqa: N802
    pipeline_configs: Sequence[Any], op: Any = None
) -> MergeConfig:
    r"""Merge the outputs of several pipelines into one stream (see :class:`MergeConfig`).

    Args:
        pipeline_configs: the pipelines (``PipelineConfig`` objects) to merge.
        op: a custom async merge ``op(info, input_queues, output_queue)``.
    """
    return MergeConfig(tuple(pipeline_configs), op)


def PathVariants(  # noqa: N802
    router: Any, paths: Sequence[Sequence[Any]], name: str | None = None
) -> PathVariantsConfig:
    """Route each item down one of several paths of stages, then join them (see
    ``PipelineBuilder.path_variants``).

    Args:
        router: returns the index of an item's path (function or async function).
        paths: sequences of stages (``Pipe``, ``Aggregate``, ``Disaggregate``,
            ``PathVariants``).
        name: the stage's name.
    """
    return PathVariantsConfig(router, tuple(tuple(p) for p in paths), name)


StageDef = (
    PipeConfig
    | AggregateConfig
    | DisaggregateConfig
    | PathVariantsConfig
    | _placement.PlacementConfig
)


@dataclass(frozen=True)
class PipelineConfig:
    """A whole pipeline as data: what :func:`~torch_spdl.pipeline.build_pipeline` takes.

    Args:
        src: the source (:class:`SourceConfig`), or several pipelines merged
            (:func:`Merge`).
        pipes: the stages, in order (from :func:`Pipe`, :func:`Aggregate`,
            :func:`Disaggregate`, :func:`PathVariants`).
        sink: the output buffer (default ``SinkConfig(3)``).
    """

    src: SourceConfig | MergeConfig
    pipes: Sequence[StageDef] = field(default_factory=list)
    sink: SinkConfig = field(default_factory=SinkConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.src, (SourceConfig, MergeConfig)):
            raise TypeError(f"src must be a SourceConfig or a MergeConfig, got {self.src!r}")
        for stage in self.pipes:
            if not isinstance(
                stage,
                (
                    PipeConfig,
                    AggregateConfig,
                    DisaggregateConfig,
                    PathVariantsConfig,
                    _placement.PlacementConfig,
                ),
            ):
                raise TypeError(
                    "pipes must hold stages made by Pipe, Aggregate, Disaggregate or "
                    f"PathVariants, or PlacementConfig markers, got {stage!r}"
                )

    def _to_builder_config(self) -> _BuilderConfig:
        if isinstance(self.src, MergeConfig):
            return _BuilderConfig(
                self.src._merged_source(), list(self.pipes), self.sink.buffer_size
            )
        return _BuilderConfig(
            self.src.source, list(self.pipes), self.sink.buffer_size, self.src.continuous
        )


def Pipe(  # noqa: N802 (SPDL's name)
    op: Any,
    /,
    *,
    concurrency: int | str = 1,
    executor: Executor | None = None,
    name: str | None = None,
    output_order: str = "completion",
    max_failures: MaxFailures | None = None,
) -> PipeConfig:
    """A ``pipe`` stage, as ``PipelineBuilder.pipe`` declares it (same checks).

    Args:
        op: the function, async function, generator or async generator to apply.
        concurrency: how many items in flight (or ``"auto"``).
        executor: a dedicated executor for a sync op.
        name: the stage's name in stats and errors.
        output_order: ``"completion"`` or ``"input"``.
        max_failures: this stage's own failure limit (a count or a ``Fraction`` rate).
    """
    builder: PipelineBuilder[Any, Any] = PipelineBuilder().add_source(())
    # SPDL's signature takes any str for these; pipe() checks the value and raises
    builder.pipe(
        op,
        concurrency=concurrency,  # type: ignore[arg-type]
        executor=executor,
        name=name,
        output_order=output_order,  # type: ignore[arg-type]
        max_failures=max_failures,
    )
    (stage,) = builder.get_config().stages
    assert isinstance(stage, PipeConfig)
    return stage


def Aggregate(  # noqa: N802
    input: int | Aggregator, /, *, drop_last: bool = False
) -> AggregateConfig:
    """Group the items (see ``PipelineBuilder.aggregate``).

    Args:
        input: the size of each list, or an :class:`Aggregator` that decides the groups.
        drop_last: drop the shorter last list (for an aggregator: skip ``flush()``).
    """
    return aggregate_config(input, drop_last=drop_last)


def Disaggregate() -> DisaggregateConfig:  # noqa: N802
    """Split each incoming list into separate items (see ``PipelineBuilder.disaggregate``)."""
    return DisaggregateConfig()


ProcessPoolExecutorConfig = _placement.ProcessPoolExecutorConfig
InterpreterPoolExecutorConfig = _placement.InterpreterPoolExecutorConfig
ExecutorConfig = _placement.ExecutorConfig
PlacementConfig = _placement.PlacementConfig
MAIN_PROCESS = _placement.MAIN_PROCESS
