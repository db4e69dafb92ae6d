"""Recording a traced run: the wrapper on each traced op and the queue sampler thread.

A traced stage runs its op through a thin wrapper that appends two ``perf_counter_ns``
stamps to a buffer owned by that worker alone (no lock), and a sampler thread records every
queue's depth and every stage's concurrency every few milliseconds. A pipeline built
without tracing runs exactly the code it ran before tracing existed: the choice is made
once per worker, not per item. What was recorded is read as a :class:`PipelineTrace`
(``trace_record.py``); the stages are seen through the :class:`TracedStage` and
:class:`StageTracer` surfaces only (``_core/protocols.py``).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._wire.channel import Channel
from .trace_record import PipelineTrace, TraceDecision, TraceSample, TraceSpan

if TYPE_CHECKING:
    from .._core.protocols import SupervisedStage, TracedStage

__all__ = ["SAMPLE_INTERVAL", "Tracer"]

SAMPLE_INTERVAL = 0.01  # seconds between two queue-depth samples


class _Buffer:
    """The stamps of one worker of one stage: ``start, end`` pairs in nanoseconds."""

    __slots__ = ("stage", "worker", "stamps")

    def __init__(self, stage: str, worker: int) -> None:
        self.stage = stage
        self.worker = worker
        self.stamps = array("q")


class Tracer:
    """Records the spans of the given stages and samples the given queues."""

    def __init__(self, stages: Sequence[TracedStage], channels: Sequence[Channel[Any]]) -> None:
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
    def _buffer(self, stage: SupervisedStage, worker: int) -> _Buffer:
        buf = _Buffer(stage.name, worker)
        with self._lock:
            self._buffers.append(buf)
        return buf

    def wrap(
        self, stage: SupervisedStage, worker: int, op: Callable[..., Any], *, generator: bool
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
        self, stage: SupervisedStage, worker: int, op: Callable[[Any], Any], *, generator: bool
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
