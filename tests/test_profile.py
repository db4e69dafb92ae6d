"""profile_pipeline: per-stage rates, the bottleneck, and the report.

A stage's cost is modelled on a virtual clock that its op advances, and the profiler reads
that clock (its ``clock`` argument), so the measured rates are exact and do not depend on
how loaded the machine is: no test here reads the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading

import pytest

from torch_spdl.pipeline import PipelineBuilder, ProfileReport, StageProfile, profile_pipeline

SLOW_S = 0.002  # what the slow stage costs per call, in virtual seconds
LEVELS = (1, 2)


class VirtualClock:
    """Seconds that pass only when an op says it spent them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 0.0

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


CLOCK = VirtualClock()


def cheap(x: int) -> int:
    return x + 1


def slow(x: int) -> int:
    CLOCK.spend(SLOW_S)
    return x


async def async_cheap(x: int) -> int:
    return x * 2


def slow_batch(batch: list[int]) -> int:
    CLOCK.spend(2 * SLOW_S)  # per call slower than `slow`, per source item 4x faster
    return sum(batch)


def odd_fails(x: int) -> int:
    if x % 2:
        raise ValueError("odd")
    return x


def cheap_then_slow() -> PipelineBuilder:
    return (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(cheap, name="cheap")
        .pipe(slow, name="slow", output_order="input")
        .pipe(async_cheap, concurrency=2, name="async_cheap")
        .add_sink(3)
    )


def profile(builder_or_config, **kwargs) -> ProfileReport:
    kwargs.setdefault("num_iterations", 40)
    kwargs.setdefault("concurrency_levels", LEVELS)
    kwargs.setdefault("file", None)
    kwargs.setdefault("clock", CLOCK)
    return profile_pipeline(builder_or_config, **kwargs)


def test_slow_stage_is_the_bottleneck():
    report = profile(cheap_then_slow())
    assert [s.name for s in report.stages] == ["1:cheap", "2:slow", "3:async_cheap"]
    assert report.bottleneck is not None
    assert report.bottleneck.name == "2:slow"
    for stage in report.stages:
        assert isinstance(stage, StageProfile)
        assert stage.num_inputs == 40
        assert stage.num_outputs == 40
        assert set(stage.rates) == set(LEVELS)
        assert all(rate > 0 for rate in stage.rates.values())
    slow_stage = report.stages[1]
    # 40 items at 2 ms each (virtual time spent one after the other): 500 items/s.
    assert slow_stage.rates == {1: pytest.approx(1 / SLOW_S), 2: pytest.approx(1 / SLOW_S)}
    # A stage that spends no virtual time measures as infinitely fast.
    assert all(s.best_rate == float("inf") for s in report.stages if s is not slow_stage)


def test_report_table_names_every_stage_and_level():
    report = profile(cheap_then_slow(), concurrency_levels=(1, 2, 4))
    table = str(report)
    for name in ("1:cheap", "2:slow", "3:async_cheap"):
        assert name in table
    for column in ("c=1", "c=2", "c=4"):
        assert column in table
    assert "bottleneck" in table
    (marked,) = [line for line in table.splitlines() if "<- bottleneck" in line]
    assert marked.startswith("2:slow")


def test_report_is_written_to_file():
    out = io.StringIO()
    report = profile(cheap_then_slow(), file=out)
    assert out.getvalue() == str(report) + "\n"


def test_file_none_writes_nothing(capsys):
    profile(cheap_then_slow(), file=None)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ""


def test_declared_concurrency_is_measured_too():
    builder = PipelineBuilder().add_source(range(100)).pipe(cheap, concurrency=3)
    (stage,) = profile(builder, concurrency_levels=(1,)).stages
    assert set(stage.rates) == {1, 3}
    assert stage.declared_concurrency == 3
    assert profile(builder, concurrency_levels=(1,)).levels == (1,)


def test_aggregate_is_handled_and_rates_are_per_source_item():
    builder = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(slow, name="per_item")
        .aggregate(8)
        .pipe(slow_batch, name="per_batch")
        .add_sink(3)
    )
    report = profile(builder)
    per_item, agg, per_batch = report.stages
    assert agg.name == "2:aggregate(8)"
    assert agg.rates == {}  # regrouping is not measured
    assert (agg.num_inputs, agg.num_outputs) == (40, 5)
    assert per_batch.num_inputs == 5
    assert per_batch.scale == pytest.approx(5 / 40)
    best = per_batch.best_concurrency
    assert per_batch.best_rate == pytest.approx(per_batch.rates[best] / per_batch.scale)
    # Per call the batch stage is the slower one; per source item it is 4x faster.
    assert report.bottleneck is per_item
    table = str(report)
    assert "2:aggregate(8)" in table
    assert "(regroup)" in table


def test_aggregate_drop_last_and_disaggregate():
    builder = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(cheap)
        .aggregate(6, drop_last=True)
        .disaggregate()
        .pipe(slow)
    )
    report = profile(builder)
    counts = [(s.num_inputs, s.num_outputs) for s in report.stages]
    assert counts == [(40, 40), (40, 6), (6, 36), (36, 36)]
    assert report.stages[3].scale == pytest.approx(36 / 40)
    assert report.bottleneck is report.stages[3]


def test_config_works_like_the_builder():
    builder = cheap_then_slow()
    report = profile(builder.get_config())
    assert [s.name for s in report.stages] == ["1:cheap", "2:slow", "3:async_cheap"]
    assert report.bottleneck is not None and report.bottleneck.name == "2:slow"


def test_failures_are_counted_and_outputs_feed_the_next_stage():
    builder = PipelineBuilder().add_source(range(1000)).pipe(odd_fails).pipe(cheap)
    first, second = profile(builder).stages
    assert (first.num_inputs, first.num_outputs, first.num_failed) == (40, 20, 20)
    assert (second.num_inputs, second.num_outputs, second.num_failed) == (20, 20, 0)


def test_async_source_is_sampled():
    async def numbers():
        for i in range(1000):
            await asyncio.sleep(0)
            yield i

    builder = PipelineBuilder().add_source(numbers()).pipe(cheap)
    (stage,) = profile(builder, num_iterations=10).stages
    assert (stage.num_inputs, stage.num_outputs) == (10, 10)


def test_default_file_is_the_current_stdout():
    out = io.StringIO()
    builder = PipelineBuilder().add_source(range(10)).pipe(cheap)
    with contextlib.redirect_stdout(out):
        report = profile_pipeline(builder, num_iterations=5, concurrency_levels=(1,))
    assert out.getvalue() == str(report) + "\n"
