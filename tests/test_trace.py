"""Tracing: spans per item per stage, queue samples, Chrome trace JSON, and the PNG plot."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spdl.pipeline import (
    PipelineBuilder,
    PipelineTrace,
    export_chrome_trace,
    plot_trace,
)

N = 50


def double(x: int) -> int:
    return 2 * x


def maybe_drop(x: int) -> int | None:
    return None if x % 5 == 0 else x


async def async_inc(x: int) -> int:
    return x + 1


def twice(x: int):
    yield x
    yield x


async def async_twice(x: int):
    yield x
    yield -x


def traced_pipeline(n: int = N):
    return (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(double, concurrency=2, name="double")
        .pipe(async_inc, concurrency=3, name="inc")
        .aggregate(10)
        .disaggregate()
        .add_sink(8)
        .build(trace=True)
    )


def test_spans_per_item_per_stage() -> None:
    pipeline = traced_pipeline()
    assert sorted(pipeline) == [2 * i + 1 for i in range(N)]
    trace = pipeline.trace()
    assert isinstance(trace, PipelineTrace)
    assert trace.stages == ["1:double", "2:inc", "3:aggregate(10)", "4:disaggregate"]
    counts = Counter(span.stage for span in trace.spans)
    assert counts == {"1:double": N, "2:inc": N, "3:aggregate(10)": N, "4:disaggregate": N // 10}
    assert all(0 <= s.start <= s.end for s in trace.spans)
    assert {s.worker for s in trace.spans if s.stage == "1:double"} <= {0, 1}
    assert [name for name, _ in trace.queues][-1] == "sink"
    assert trace.samples, "the queue depths were never sampled"
    for sample in trace.samples:
        assert len(sample.queue_depths) == len(trace.queues)
        assert len(sample.concurrency) == len(trace.stages)


def test_chrome_trace_is_valid_json_with_the_expected_events(tmp_path: Path) -> None:
    pipeline = traced_pipeline()
    list(pipeline)
    path = tmp_path / "trace.json"
    pipeline.export_chrome_trace(path)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    kinds = Counter(e["ph"] for e in events)
    assert set(kinds) == {"M", "X", "C"}
    spans = [e for e in events if e["ph"] == "X"]
    assert Counter(e["name"] for e in spans)["1:double"] == N
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["tid"], int) for e in spans)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {e["tid"] for e in spans} <= set(tracks)  # every span is on a named track
    assert "1:double #0" in tracks.values()
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"queue 1:double input", "queue sink", "concurrency 1:double"} <= counters
    export_chrome_trace(pipeline, tmp_path / "again.json")  # the function form
    assert json.loads((tmp_path / "again.json").read_text())["traceEvents"]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pipeline = traced_pipeline(200)
    list(pipeline)
    path = tmp_path / "trace.png"
    pipeline.plot_trace(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    plot_trace(pipeline.trace(), tmp_path / "again.png", bin_seconds=0.05)
    assert (tmp_path / "again.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="bin_seconds"):
        plot_trace(pipeline, tmp_path / "bad.png", bin_seconds=0)


def test_plot_shows_autotuned_concurrency(tmp_path: Path) -> None:
    pipeline = (
        PipelineBuilder().add_source(range(20)).pipe(double, concurrency="auto").build(trace=True)
    )
    list(pipeline)
    pipeline.plot_trace(tmp_path / "auto.png")
    assert (tmp_path / "auto.png").stat().st_size > 1000


def test_untraced_pipeline_says_how_to_trace() -> None:
    pipeline = PipelineBuilder().add_source(range(3)).pipe(double).build()
    list(pipeline)
    with pytest.raises(RuntimeError, match="trace=True"):
        pipeline.trace()
    with pytest.raises(TypeError, match="PipelineTrace"):
        export_chrome_trace(object(), "unused.json")


def test_failed_items_are_traced_too() -> None:
    def fails_on_odd(x: int) -> int:
        if x % 2:
            raise ValueError("odd")
        return x

    pipeline = PipelineBuilder().add_source(range(10)).pipe(fails_on_odd).build(trace=True)
    assert sorted(pipeline) == [0, 2, 4, 6, 8]
    assert len(pipeline.trace().spans) == 10


OPS = {
    "func": (double, {}),
    "drops": (maybe_drop, {}),
    "gen": (twice, {}),
    "async": (async_inc, {}),
    "async gen": (async_twice, {}),
    "ordered": (double, {"output_order": "input"}),
    "ordered gen": (twice, {"output_order": "input"}),
    "ordered async": (async_inc, {"output_order": "input"}),
}


def _run(items: list[int], stages: list[str], conc: int, trace: bool) -> list[int]:
    builder = PipelineBuilder().add_source(items)
    for name in stages:
        op, kwargs = OPS[name]
        builder.pipe(op, concurrency=conc, **kwargs)
    return list(builder.add_sink(4).build(trace=trace))


@settings(max_examples=25, deadline=None)
@given(
    items=st.lists(st.integers(-1000, 1000), max_size=40),
    stages=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=3),
    conc=st.integers(1, 4),
)
def test_tracing_does_not_change_results(items: list[int], stages: list[str], conc: int) -> None:
    plain = _run(items, stages, conc, trace=False)
    traced = _run(items, stages, conc, trace=True)
    if all(OPS[s][1].get("output_order") == "input" for s in stages) or conc == 1:
        assert traced == plain
    else:
        assert sorted(traced) == sorted(plain)
