"""``profile_pipeline``: measure each stage alone at several concurrency levels.

The source is sampled once; then each stage runs by itself over the previous stage's
outputs, once per concurrency level, so a stage's figure is not capped by its neighbours.
Rates are expressed per source item (a stage after ``aggregate(32)`` that handles 10
batches/s serves 320 source items/s), so the slowest row is the pipeline's bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from ._builder import PipelineBuilder
from ._declare.config import (
    AggregateConfig,
    DisaggregateConfig,
    PipeConfig,
    PipelineSpec,
    StageConfig,
)
from ._declare.placement import PlacementConfig
from ._plugins.queues import QueuePerfStats, StatsQueue
from ._run.pipeline import Pipeline

__all__ = ["profile_pipeline", "ProfileHook", "ProfileReport", "ProfileResult", "StageProfile"]


class ProfileHook(ABC):
    """SPDL's profiling hook: code to run around the whole profile and each measurement."""

    @abstractmethod
    def stage_profile_hook(self, stage: str, concurrency: int) -> AbstractContextManager[None]:
        """A context manager entered around one stage's run at one concurrency."""

    @abstractmethod
    def pipeline_profile_hook(self) -> AbstractContextManager[None]:
        """A context manager entered around the whole :func:`profile_pipeline` call."""


@dataclass
class ProfileStats:
    """One measurement of a stage (SPDL's per-concurrency figures)."""

    concurrency: int
    qps: float  # items per second through the stage
    occupancy_rate: float  # the fraction of the run its output queue held items


@dataclass
class ProfileResult:
    """SPDL's per-stage result: the stage's ``name`` and one :class:`ProfileStats` per
    concurrency level tried (highest first, as SPDL lists them)."""

    name: str
    stats: Sequence[ProfileStats]


@dataclass
class StageProfile:
    """One stage's measurements: ``rates[c]`` is items/s through it at concurrency ``c``."""

    name: str
    num_inputs: int
    num_outputs: int
    scale: float  # stage items per source item
    declared_concurrency: int
    rates: dict[int, float] = field(default_factory=dict)
    num_failed: int = 0
    occupancy: dict[int, float] = field(default_factory=dict)

    def result(self) -> ProfileResult:
        """These measurements as SPDL's :class:`ProfileResult`."""
        levels = sorted(self.rates, reverse=True)
        return ProfileResult(
            self.name,
            [ProfileStats(c, self.rates[c], self.occupancy.get(c, 0.0)) for c in levels],
        )

    @property
    def best_concurrency(self) -> int:
        return max(self.rates, key=self.rates.__getitem__)

    @property
    def best_rate(self) -> float:
        """The best rate, in source items per second."""
        return self.rates[self.best_concurrency] / self.scale if self.scale else float("inf")


@dataclass
class ProfileReport:
    """Per-stage profiles and the bottleneck among them."""

    stages: list[StageProfile]
    levels: tuple[int, ...]

    # SPDL's profile_pipeline returns a sequence of ProfileResult: the report is one.
    def results(self) -> list[ProfileResult]:
        """One SPDL :class:`ProfileResult` per stage."""
        return [s.result() for s in self.stages]

    def __len__(self) -> int:
        return len(self.stages)

    def __getitem__(self, index: int) -> ProfileResult:
        return self.stages[index].result()

    def __iter__(self) -> Iterator[ProfileResult]:
        return iter(self.results())

    @property
    def bottleneck(self) -> StageProfile | None:
        measured = [s for s in self.stages if s.rates]
        return min(measured, key=lambda s: s.best_rate) if measured else None

    def __str__(self) -> str:
        cols = "".join(f"{'c=' + str(c):>11}" for c in self.levels)
        head = f"{'stage':<28}{'items':>7}{cols}{'best (src items/s)':>22}"
        lines = [head, "-" * len(head)]
        slowest = self.bottleneck
        for s in self.stages:
            rates = "".join(
                f"{s.rates[c]:>11.1f}" if c in s.rates else f"{'-':>11}" for c in self.levels
            )
            best = f"{s.best_rate:.1f} @c={s.best_concurrency}" if s.rates else "(regroup)"
            mark = "  <- bottleneck" if s is slowest else ""
            lines.append(f"{s.name[:28]:<28}{s.num_inputs:>7}{rates}{best:>22}{mark}")
        if slowest is not None:
            lines.append(
                f"bottleneck: {slowest.name!r}, at most {slowest.best_rate:.1f} source items/s "
                f"(at concurrency {slowest.best_concurrency})"
            )
        return "\n".join(lines)


def _sample(source: Any, n: int) -> list[Any]:
    if isinstance(source, Iterable):
        return list(itertools.islice(source, n))
    assert isinstance(source, AsyncIterable)

    async def take() -> list[Any]:
        out: list[Any] = []
        async for item in source:
            out.append(item)
            if len(out) >= n:
                break
        return out

    return asyncio.run(take())


class _SinkStats(StatsQueue):
    """Keeps the output queue's figures (SPDL measures occupancy there)."""

    last: QueuePerfStats | None = None

    async def final_stats_callback(self, stats: QueuePerfStats) -> None:
        if self.name == "sink":
            type(self).last = stats


def _run_stage(
    spec: PipeConfig,
    inputs: list[Any],
    concurrency: int,
    num_threads: int | None,
    clock: Callable[[], float],
) -> tuple[float, list[Any], int, float]:
    class _Sink(_SinkStats):  # a class of its own: ``last`` is this run's
        pass

    sink_stats = _Sink
    pipeline: Pipeline[Any] = (
        PipelineBuilder()
        .add_source(inputs)
        .pipe(
            spec.op,
            concurrency=concurrency,
            executor=spec.executor,
            output_order=spec.output_order,
            name=spec.label(),
        )
        .add_sink(0)
        .build(num_threads=num_threads, queue_class=sink_stats)
    )
    t0 = clock()
    with pipeline.auto_stop():
        outputs = list(pipeline)
    elapsed = clock() - t0
    failed = pipeline.get_stats()[1].num_failed
    occupancy = sink_stats.last.occupancy_rate if sink_stats.last is not None else 0.0
    rate = len(inputs) / elapsed if elapsed > 0 else float("inf")
    return rate, outputs, failed, occupancy


def profile_pipeline(
    pipeline: Any,
    num_inputs: int | None = None,
    *,
    num_iterations: int = 100,
    concurrency_levels: Sequence[int] = (1, 2, 4, 8),
    num_threads: int | None = None,
    file: IO[str] | None | Literal["stdout"] = "stdout",
    callback: Callable[[ProfileResult], None] | None = None,
    hook: ProfileHook | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ProfileReport:
    """Profile every stage of ``pipeline`` on ``num_iterations`` items from its source.

    Each ``pipe`` stage runs alone at each level of ``concurrency_levels`` (and at its
    declared concurrency). Ops are called once per item per level, so they should be free of
    side effects. The table is written to ``file`` (default: the current ``sys.stdout``;
    ``None``: not written) and returned as a
    :class:`ProfileReport`, whose ``bottleneck`` names the slowest stage. The report is
    also SPDL's sequence of :class:`ProfileResult` (one per stage).

    Args:
        pipeline: a builder, ``get_config()``, or SPDL's ``defs.PipelineConfig``.
        num_inputs: SPDL's name for ``num_iterations`` (wins when given).
        num_iterations: how many source items to profile on.
        concurrency_levels: the concurrencies to try.
        num_threads: as in ``build``.
        file: where to write the table.
        callback: SPDL: called with each stage's :class:`ProfileResult` once measured.
        hook: SPDL: a :class:`ProfileHook` entered around the whole profile and each run.
        clock: seconds, read before and after each measured run (default
            ``time.perf_counter``); a test can pass a clock its ops advance, so that the
            rates do not depend on how loaded the machine is.
    """
    if num_inputs is not None:
        num_iterations = num_inputs
    if isinstance(pipeline, PipelineBuilder):
        config = pipeline.get_config()
    elif hasattr(pipeline, "_to_builder_config"):
        config = pipeline._to_builder_config()
    else:
        config = pipeline
    # regions are measured stage by stage, in this process
    stages: list[StageConfig] = [s for s in config.stages if not isinstance(s, PlacementConfig)]
    config = PipelineSpec(config.source, stages, config.buffer_size)
    around = hook.pipeline_profile_hook() if hook is not None else contextlib.nullcontext()
    with around:
        report = _profile(
            config, num_iterations, concurrency_levels, num_threads, callback, hook, clock
        )
    if file == "stdout":
        file = sys.stdout
    if file is not None:
        file.write(str(report) + "\n")
    return report


def _profile(
    config: PipelineSpec,
    num_iterations: int,
    concurrency_levels: Sequence[int],
    num_threads: int | None,
    callback: Callable[[ProfileResult], None] | None,
    hook: ProfileHook | None,
    clock: Callable[[], float],
) -> ProfileReport:
    inputs = _sample(config.source, num_iterations)
    num_source = max(len(inputs), 1)
    levels = tuple(sorted(set(concurrency_levels)))
    profiles: list[StageProfile] = []
    for i, spec in enumerate(config.stages):
        name = f"{i + 1}:{spec.label()}"
        scale = len(inputs) / num_source
        if isinstance(spec, AggregateConfig):
            aggregator = spec.make_aggregator()
            outputs = [o for x in inputs if (o := aggregator.accumulate(x)) is not None]
            if not spec.drop_last and (last := aggregator.flush()) is not None:
                outputs.append(last)
            profiles.append(StageProfile(name, len(inputs), len(outputs), scale, 1))
        elif isinstance(spec, DisaggregateConfig):
            outputs = [x for batch in inputs for x in batch]
            profiles.append(StageProfile(name, len(inputs), len(outputs), scale, 1))
        elif isinstance(spec, PipeConfig):
            # an autotuned stage is measured at the levels; its outputs come from the top one
            declared = max(levels) if spec.auto else int(spec.concurrency)
            profile = StageProfile(name, len(inputs), 0, scale, declared)
            outputs = []
            for level in sorted(set(levels) | {declared}):
                around = (
                    hook.stage_profile_hook(name, level)
                    if hook is not None
                    else contextlib.nullcontext()
                )
                with around:
                    rate, produced, failed, occupancy = _run_stage(
                        spec, inputs, level, num_threads, clock
                    )
                profile.rates[level] = rate
                profile.occupancy[level] = occupancy
                if level == declared:
                    outputs, profile.num_failed = produced, failed
            profile.num_outputs = len(outputs)
            profiles.append(profile)
        else:
            raise TypeError(
                f"profile_pipeline: stage {name} ({type(spec).__name__}) cannot be measured "
                "alone; profile the pipes of each path as a pipeline of their own"
            )
        if callback is not None:
            callback(profiles[-1].result())
        inputs = outputs
        if not inputs:
            break
    return ProfileReport(profiles, tuple(sorted(set(levels))))
