"""``profile_pipeline``: measure each stage alone at several concurrency levels.

The source is sampled once; then each stage runs by itself over the previous stage's
outputs, once per concurrency level, so a stage's figure is not capped by its neighbours.
Rates are expressed per source item (a stage after ``aggregate(32)`` that handles 10
batches/s serves 320 source items/s), so the slowest row is the pipeline's bottleneck.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from ._builder import (
    AggregateConfig,
    DisaggregateConfig,
    PipeConfig,
    PipelineBuilder,
    PipelineConfig,
)

__all__ = ["profile_pipeline", "ProfileReport", "StageProfile"]


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


def _run_stage(
    spec: PipeConfig,
    inputs: list[Any],
    concurrency: int,
    num_threads: int | None,
    clock: Callable[[], float],
) -> tuple[float, list[Any], int]:
    pipeline = (
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
        .build(num_threads=num_threads)
    )
    t0 = clock()
    with pipeline.auto_stop():
        outputs = list(pipeline)
    elapsed = clock() - t0
    failed = pipeline.get_stats()[1].num_failed
    return len(inputs) / elapsed if elapsed > 0 else float("inf"), outputs, failed


def profile_pipeline(
    pipeline: PipelineBuilder[Any, Any] | PipelineConfig,
    *,
    num_iterations: int = 100,
    concurrency_levels: Sequence[int] = (1, 2, 4, 8),
    num_threads: int | None = None,
    file: IO[str] | None | Literal["stdout"] = "stdout",
    clock: Callable[[], float] = time.perf_counter,
) -> ProfileReport:
    """Profile every stage of ``pipeline`` on ``num_iterations`` items from its source.

    Each ``pipe`` stage runs alone at each level of ``concurrency_levels`` (and at its
    declared concurrency). Ops are called once per item per level, so they should be free of
    side effects. The table is written to ``file`` and returned as a
    :class:`ProfileReport`, whose ``bottleneck`` names the slowest stage.

    Args:
        pipeline: The builder or its config; its source is sampled once.
        num_iterations: How many source items to sample and push through each stage.
        concurrency_levels: The concurrency levels every ``pipe`` stage is measured at.
        num_threads: The thread pool size of each measuring pipeline (default: the
            engine's).
        file: Where the table goes: the current ``sys.stdout`` by default, ``None`` for
            nowhere.
        clock: Seconds, read before and after each measured run (default
            ``time.perf_counter``); a test can pass a clock its ops advance, so that the
            rates do not depend on how loaded the machine is.
    """
    config = pipeline.get_config() if isinstance(pipeline, PipelineBuilder) else pipeline
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
        else:
            # an autotuned stage is measured at the levels; its outputs come from the top one
            declared = max(levels) if spec.auto else int(spec.concurrency)
            profile = StageProfile(name, len(inputs), 0, scale, declared)
            outputs = []
            for level in sorted(set(levels) | {declared}):
                rate, produced, failed = _run_stage(spec, inputs, level, num_threads, clock)
                profile.rates[level] = rate
                if level == declared:
                    outputs, profile.num_failed = produced, failed
            profile.num_outputs = len(outputs)
            profiles.append(profile)
        inputs = outputs
        if not inputs:
            break
    report = ProfileReport(profiles, tuple(sorted(set(levels))))
    if file == "stdout":
        file = sys.stdout
    if file is not None:
        file.write(str(report) + "\n")
    return report
