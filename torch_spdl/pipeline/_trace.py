"""Tracing a run: when each item's op started and ended, and queue depths over time.

Tracing is decided when a pipeline is built (``build(trace=True)``). A traced stage runs its
op through a thin wrapper that appends two ``perf_counter_ns`` stamps to a buffer owned by
that worker alone (no lock), and a sampler thread records every queue's depth and every
stage's concurrency every few milliseconds. A pipeline built without tracing runs exactly
the code it ran before tracing existed: the choice is made once per worker, not per item.
The autotuner reports each of its decisions here too (:class:`TraceDecision`), so a trace
shows what it chose and why: a counter track per autotuned stage and an instant event
with the reason.
"""

from __future__ import annotations

import json
import os
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ._channel import Channel

if TYPE_CHECKING:
    from ._node import Node, OpStage

__all__ = [
    "PipelineTrace",
    "TraceDecision",
    "TraceSample",
    "TraceSpan",
    "Tracer",
    "export_chrome_trace",
]

SAMPLE_INTERVAL = 0.01  # seconds between two queue-depth samples


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
        tids: dict[tuple[str, int], int] = {}
        for span in self.spans:
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
        for span in self.spans:
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
        for sample in self.samples:
            ts = sample.time * 1e6
            for (name, _), depth in zip(self.queues, sample.queue_depths, strict=True):
                events.append(
                    {
                        "name": f"queue {name}",
                        "ph": "C",
                        "ts": ts,
                        "pid": 1,
                        "args": {"depth": depth},
                    }
                )
            for stage, conc in zip(self.stages, sample.concurrency, strict=True):
                events.append(
                    {
                        "name": f"concurrency {stage}",
                        "ph": "C",
                        "ts": ts,
                        "pid": 1,
                        "args": {"workers": conc},
                    }
                )
        for d in self.decisions:
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
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_chrome_trace` to ``path`` (open it in ui.perfetto.dev)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_chrome_trace(), f)

    def plot(self, path: str | os.PathLike[str], *, bin_seconds: float | None = None) -> None:
        """Draw per-stage throughput and queue occupancy over time to a PNG at ``path``."""
        from ._plot import plot_trace

        plot_trace(self, path, bin_seconds=bin_seconds)


def export_chrome_trace(trace: Any, path: str | os.PathLike[str]) -> None:
    """Write the trace of ``trace`` (a :class:`PipelineTrace` or a traced ``Pipeline``) to
    ``path`` as Chrome trace JSON, which Perfetto and chrome://tracing load."""
    as_trace(trace).export_chrome_trace(path)


def as_trace(obj: Any) -> PipelineTrace:
    """``obj`` itself if it is a trace, else ``obj.trace()`` (a traced pipeline)."""
    if isinstance(obj, PipelineTrace):
        return obj
    getter = getattr(obj, "trace", None)
    if getter is None:
        raise TypeError(f"expected a PipelineTrace or a traced Pipeline, got {obj!r}")
    return getter()


class _Buffer:
    """The stamps of one worker of one stage: ``start, end`` pairs in nanoseconds."""

    __slots__ = ("stage", "worker", "stamps")

    def __init__(self, stage: str, worker: int) -> None:
        self.stage = stage
        self.worker = worker
        self.stamps = array("q")


class Tracer:
    """Records the spans of the given stages and samples the given queues."""

    def __init__(self, stages: Sequence[OpStage], channels: Sequence[Channel[Any]]) -> None:
        self._stages = list(stages)
        self._channels = list(channels)
        self._buffers: list[_Buffer] = []
        self._samples: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        self._decisions: list[tuple[int, str | None, int | None, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._origin = time.perf_counter_ns()
        self.thread = threading.Thread(target=self._run, name="torch_spdl-trace", daemon=True)
        for stage in self._stages:
            stage.tracer = self

    # -- recording (worker side) -----------------------------------------------------------
    def _buffer(self, stage: Node, worker: int) -> _Buffer:
        buf = _Buffer(stage.name, worker)
        with self._lock:
            self._buffers.append(buf)
        return buf

    def wrap(
        self, stage: Node, worker: int, op: Callable[..., Any], *, generator: bool
    ) -> Callable[..., Any]:
        """``op`` recording one span per call (a generator: until it is exhausted). A plain
        op may take any arguments (the general thread path's ``compute(item, outs)``)."""
        append = self._buffer(stage, worker).stamps.append
        clock = time.perf_counter_ns

        if generator:

            def traced_gen(item: Any) -> Any:
                t0 = clock()
                try:
                    yield from op(item)
                finally:
                    append(t0)
                    append(clock())

            return traced_gen

        def traced(*args: Any) -> Any:
            t0 = clock()
            try:
                return op(*args)
            finally:
                append(t0)
                append(clock())

        return traced

    def wrap_async(
        self, stage: Node, worker: int, op: Callable[[Any], Any], *, generator: bool
    ) -> Callable[[Any], Any]:
        """An async op (or async generator) recording one span per call."""
        append = self._buffer(stage, worker).stamps.append
        clock = time.perf_counter_ns

        if generator:

            async def traced_agen(item: Any) -> Any:
                t0 = clock()
                try:
                    async for out in op(item):
                        yield out
                finally:
                    append(t0)
                    append(clock())

            return traced_agen

        async def traced(item: Any) -> Any:
            t0 = clock()
            try:
                return await op(item)
            finally:
                append(t0)
                append(clock())

        return traced

    def record_decision(self, stage: str | None, concurrency: int | None, reason: str) -> None:
        """An autotuner decision, stamped now (called from the autotuner's thread)."""
        self._decisions.append((time.perf_counter_ns(), stage, concurrency, reason))

    # -- sampling (its own thread) ---------------------------------------------------------
    def reset_origin(self) -> None:
        self._origin = time.perf_counter_ns()

    def stop(self) -> None:
        self._stop.set()

    def _sample(self) -> None:
        depths = tuple(len(c) for c in self._channels)
        conc = tuple(s.concurrency for s in self._stages)
        self._samples.append((time.perf_counter_ns(), depths, conc))

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(SAMPLE_INTERVAL):
            self._sample()
            if all(s.finished for s in self._stages) and not any(len(c) for c in self._channels):
                return
        self._sample()

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> PipelineTrace:
        """Everything recorded so far (callable while the pipeline runs)."""
        origin = self._origin
        with self._lock:
            buffers = list(self._buffers)
        spans: list[TraceSpan] = []
        for buf in buffers:
            stamps = buf.stamps[:]  # one atomic copy: the worker may be appending
            for i in range(0, len(stamps) - 1, 2):
                spans.append(
                    TraceSpan(
                        buf.stage,
                        buf.worker,
                        (stamps[i] - origin) / 1e9,
                        (stamps[i + 1] - origin) / 1e9,
                    )
                )
        spans.sort(key=lambda s: s.start)
        samples = [
            TraceSample((t - origin) / 1e9, depths, conc) for t, depths, conc in list(self._samples)
        ]
        decisions = [
            TraceDecision((t - origin) / 1e9, stage, conc, why)
            for t, stage, conc, why in list(self._decisions)
        ]
        return PipelineTrace(
            stages=[s.name for s in self._stages],
            queues=[(c.name, c.capacity) for c in self._channels],
            spans=spans,
            samples=samples,
            decisions=decisions,
        )
