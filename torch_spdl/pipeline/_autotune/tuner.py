"""The autotuner's sampler thread: it measures a running pipeline and applies decisions.

Every tick it reads each stage through the small :class:`TunableStage` surface (never a
stage's queues or workers directly), turns the differences into an :class:`AutotuneSample`,
asks the controller (``rules.py``), applies the answer, records it in the trace, and
remembers what is held (``memory.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from .._core.protocols import StageReading, TunableStage
from . import memory
from .probes import cpu_count, process_cpu_seconds, read_rss
from .rules import AutotuneController
from .vocabulary import AutotuneConfig, AutotuneSample, StageSample

__all__ = ["Autotuner"]

_LG = logging.getLogger("torch_spdl.pipeline.autotune")


class DecisionSink(Protocol):
    """Where decisions go besides the log (the tracer)."""

    def record_decision(self, stage: str | None, concurrency: int | None, reason: str) -> None: ...


class Autotuner:
    """The thread that measures the pipeline every tick and applies the controller's answers.

    Args:
        stages: the pipeline's op stages, in order.
        delivered: how many items the consumer has taken so far.
        config: the controller's knobs.
        trace: where to record each decision (a tracer), if anywhere.
    """

    def __init__(
        self,
        stages: Sequence[TunableStage],
        delivered: Callable[[], int],
        config: AutotuneConfig,
        *,
        trace: DecisionSink | None = None,
    ) -> None:
        self.stages = list(stages)
        self._delivered = delivered
        self._by_name = {s.name: s for s in self.stages}
        self._cores = cpu_count()
        self.controller = AutotuneController(config, cores=self._cores)
        self._trace = trace
        self._told = 0  # controller events already forwarded
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="torch_spdl-autotune", daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def _raw(self) -> tuple[float, float, int, list[StageReading]]:
        return (
            time.perf_counter(),
            process_cpu_seconds(),
            self._delivered(),
            [s.reading() for s in self.stages],
        )

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # the tuner must never take the pipeline down
            _LG.exception("autotune stopped on an internal error; concurrency stays as is")

    def _loop(self) -> None:
        prev = self._raw()
        while not self._stop.wait(self.controller.interval):
            if all(s.finished for s in self.stages):
                return
            cur = self._raw()
            sample = self._sample(prev, cur)
            prev = cur
            for name, n in self.controller.step(sample).items():
                self._by_name[name].set_concurrency(n)
            self._publish()

    def _publish(self) -> None:
        """Forward new decisions to the trace; remember the configuration held."""
        events = self.controller.events
        if self._trace is not None:
            for e in events[self._told :]:
                self._trace.record_decision(e.stage, e.concurrency, e.reason)
        self._told = len(events)
        held = self.controller.held()
        for s in self.stages:
            if s.tunable and s.name in held:
                memory.remember(s.tune_key, held[s.name])

    def _sample(
        self,
        prev: tuple[float, float, int, list[StageReading]],
        cur: tuple[float, float, int, list[StageReading]],
    ) -> AutotuneSample:
        (t0, cpu0, n0, r0), (t1, cpu1, n1, r1) = prev, cur
        wall = max(t1 - t0, 1e-9)
        stages = []
        for s, a, b in zip(self.stages, r0, r1, strict=True):
            cpu = None if a.cpu is None or b.cpu is None else b.cpu - a.cpu
            metered = None if a.metered is None or b.metered is None else b.metered - a.metered
            age = 0.0 if b.pending_since is None else max(0.0, t1 - b.pending_since)
            stages.append(
                StageSample(
                    name=s.name,
                    concurrency=s.concurrency,
                    max_concurrency=s.bound,
                    tunable=s.tunable,
                    in_occupancy=b.inbox.occupancy(a.inbox),
                    out_occupancy=b.outbox.occupancy(a.outbox),
                    measured=True,
                    items=b.items - a.items,
                    busy=b.busy - a.busy,
                    cpu_busy=cpu,
                    min_concurrency=s.floor,
                    metered=metered,
                    pending=b.pending,
                    pending_age=age,
                )
            )
        return AutotuneSample(
            throughput=(n1 - n0) / wall,
            cpu=(cpu1 - cpu0) / (wall * self._cores),
            rss=read_rss(),
            stages=tuple(stages),
            seconds=wall,
        )
