"""What a traced run recorded: when each item's op started and ended, queue depths over time.

Tracing is decided when a pipeline is built (``build(trace=True)``); ``tracer.py``
records, and this module holds the record, :class:`PipelineTrace`, and its two ways out:
Chrome trace JSON (:func:`export_chrome_trace`) and a PNG (:func:`plot_trace`: per-stage
throughput, queue occupancy and autotuned concurrency over time; matplotlib is imported
inside it only, and draws on a bare ``Figure`` with the Agg renderer, so it needs no
display and leaves pyplot's backend alone). The autotuner reports each of its decisions
here too (:class:`TraceDecision`), so a trace shows what it chose and why: a counter track
per autotuned stage and an instant event with the reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "PipelineTrace",
    "TraceDecision",
    "TraceSample",
    "TraceSpan",
    "as_trace",
    "export_chrome_trace",
    "plot_trace",
]


class TraceSpan(NamedTuple):
    """One call of a stage's op on one item: seconds since the run started."""

    stage: str
    worker: int
    start: float
    end: float


class TraceSample(NamedTuple):
    """Queue depths (one per queue) and stage concurrencies (one per stage) at ``time``."""

    time: float
    queue_depths: tuple[int, ...]
    concurrency: tuple[int, ...]


class TraceDecision(NamedTuple):
    """One decision of the autotuner at ``time``: ``stage`` set to ``concurrency`` (both
    None for a decision that changed nothing, such as holding), and why."""

    time: float
    stage: str | None
    concurrency: int | None
    reason: str


@dataclass
class PipelineTrace:
    """What a traced run recorded; times are seconds since the pipeline started.

    ``stages`` names the traced stages in pipeline order, ``queues`` the queues (name,
    capacity; 0 means unbounded) in pipeline order, the input queue of each stage then the
    sink. ``spans`` has one entry per item per stage; ``samples`` the periodic depths;
    ``decisions`` the autotuner's decisions, in order.
    """

    stages: list[str]
    queues: list[tuple[str, int]]
    spans: list[TraceSpan]
    samples: list[TraceSample]
    decisions: list[TraceDecision] = field(default_factory=list)

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as a Chrome trace / Perfetto JSON object.

        Each span is a complete event (``"ph": "X"``) on a track per worker; each queue is
        a counter (``"ph": "C"``) of its depth, and each stage one of its concurrency.
        Each autotuner decision is an instant event (``"ph": "i"``, named ``autotune``,
        the reason in its ``args``) and, when it set a stage, a point of that stage's
        counter ``autotune <stage>``.
        """
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "torch_spdl"}}
        ]
        events += _span_events(self.spans)
        events += _counter_events(self)
        events += _decision_events(self.decisions)
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_chrome_trace` to ``path`` (open it in ui.perfetto.dev)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_chrome_trace(), f)

    def plot(self, path: str | os.PathLike[str], *, bin_seconds: float | None = None) -> None:
        """Draw per-stage throughput and queue occupancy over time to a PNG at ``path``."""
        plot_trace(self, path, bin_seconds=bin_seconds)


def _span_events(spans: list[TraceSpan]) -> list[dict[str, Any]]:
    """A track per (stage, worker), named and sorted in order of first span, and each
    span as a complete event on its track."""
    events: list[dict[str, Any]] = []
    tids: dict[tuple[str, int], int] = {}
    for span in spans:
        key = (span.stage, span.worker)
        if key not in tids:
            tids[key] = len(tids) + 1
    for (stage, worker), tid in sorted(tids.items(), key=lambda kv: kv[1]):
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "args": {"name": f"{stage} #{worker}"},
            }
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    for span in spans:
        events.append(
            {
                "name": span.stage,
                "cat": "stage",
                "ph": "X",
                "ts": span.start * 1e6,
                "dur": (span.end - span.start) * 1e6,
                "pid": 1,
                "tid": tids[(span.stage, span.worker)],
            }
        )
    return events


def _counter_events(trace: PipelineTrace) -> list[dict[str, Any]]:
    """Each sample as counters: every queue's depth, every stage's concurrency."""
    events: list[dict[str, Any]] = []
    for sample in trace.samples:
        ts = sample.time * 1e6
        for (name, _), depth in zip(trace.queues, sample.queue_depths, strict=True):
            events.append(
                {"name": f"queue {name}", "ph": "C", "ts": ts, "pid": 1, "args": {"depth": depth}}
            )
        for stage, conc in zip(trace.stages, sample.concurrency, strict=True):
            events.append(
                {
                    "name": f"concurrency {stage}",
                    "ph": "C",
                    "ts": ts,
                    "pid": 1,
                    "args": {"workers": conc},
                }
            )
    return events


def _decision_events(decisions: list[TraceDecision]) -> list[dict[str, Any]]:
    """Each autotuner decision: a point of its stage's counter when it set one, and an
    instant event with the reason."""
    events: list[dict[str, Any]] = []
    for d in decisions:
        ts = d.time * 1e6
        if d.stage is not None and d.concurrency is not None:
            events.append(
                {
                    "name": f"autotune {d.stage}",
                    "ph": "C",
                    "ts": ts,
                    "pid": 1,
                    "args": {"concurrency": d.concurrency},
                }
            )
        events.append(
            {
                "name": "autotune",
                "cat": "autotune",
                "ph": "i",
                "s": "p",
                "ts": ts,
                "pid": 1,
                "args": {"stage": d.stage, "concurrency": d.concurrency, "reason": d.reason},
            }
        )
    return events


def export_chrome_trace(trace: Any, path: str | os.PathLike[str]) -> None:
    """Write a trace as Chrome trace JSON, which Perfetto and chrome://tracing load.

    Args:
        trace: a :class:`PipelineTrace` or a traced ``Pipeline``.
        path: the file to write.
    """
    as_trace(trace).export_chrome_trace(path)


def as_trace(obj: Any) -> PipelineTrace:
    """``obj`` itself if it is a trace, else ``obj.trace()`` (a traced pipeline)."""
    if isinstance(obj, PipelineTrace):
        return obj
    getter = getattr(obj, "trace", None)
    if getter is None:
        raise TypeError(f"expected a PipelineTrace or a traced Pipeline, got {obj!r}")
    return getter()


def _bins(end: float, bin_seconds: float | None) -> float:
    if bin_seconds is not None:
        if bin_seconds <= 0:
            raise ValueError(f"bin_seconds must be positive, got {bin_seconds!r}")
        return bin_seconds
    return max(end / 100, 0.01)  # about 100 bins over the run


def plot_trace(
    trace: PipelineTrace | Any, path: str | os.PathLike[str], *, bin_seconds: float | None = None
) -> None:
    """Write a PNG of per-stage throughput and queue occupancy over time to ``path``.

    Args:
        trace: a :class:`PipelineTrace` or a traced ``Pipeline``.
        path: the file to write.
        bin_seconds: the width of a throughput bin (default: a hundredth of the run, at
            least 10 ms).
    """
    try:  # a bare Figure renders with Agg and leaves pyplot's backend alone
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib is optional for the library
        raise ImportError("plot_trace needs matplotlib: pip install matplotlib") from exc

    data = as_trace(trace)
    end = max(
        [s.end for s in data.spans] + [s.time for s in data.samples] + [1e-3],
    )
    width = _bins(end, bin_seconds)
    nbins = int(end / width) + 1
    tuned = [
        i for i in range(len(data.stages)) if len({s.concurrency[i] for s in data.samples}) > 1
    ]
    rows = 3 if tuned else 2
    fig = Figure(figsize=(10, 2.8 * rows), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]

    counts = {stage: [0] * nbins for stage in data.stages}
    for span in data.spans:
        counts[span.stage][min(int(span.end / width), nbins - 1)] += 1
    ax = axes[0]
    for stage in data.stages:
        ax.plot(
            [(i + 0.5) * width for i in range(nbins)],
            [c / width for c in counts[stage]],
            label=stage,
        )
    ax.set_ylabel("items/s out")
    ax.set_title("throughput per stage")
    ax.legend(fontsize="small", loc="upper right")

    ax = axes[1]
    times = [s.time for s in data.samples]
    for q, (name, capacity) in enumerate(data.queues):
        depths = [s.queue_depths[q] for s in data.samples]
        if capacity:
            ax.plot(times, [d / capacity for d in depths], label=name)
        else:
            peak = max(depths, default=0) or 1
            ax.plot(times, [d / peak for d in depths], label=f"{name} (unbounded, / max)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("depth / capacity")
    ax.set_title("queue occupancy (full input + empty output = bottleneck)")
    ax.legend(fontsize="small", loc="upper right")

    if tuned:
        ax = axes[2]
        for i in tuned:
            ax.step(
                times, [s.concurrency[i] for s in data.samples], where="post", label=data.stages[i]
            )
        ax.set_ylabel("workers")
        ax.set_title("concurrency of autotuned stages")
        ax.legend(fontsize="small", loc="upper left")
    axes[-1].set_xlabel("seconds since start")
    fig.savefig(os.fspath(path), dpi=100)
