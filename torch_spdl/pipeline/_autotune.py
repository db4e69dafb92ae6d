"""Automatic concurrency: a hill-climbing controller and the thread that feeds it.

:class:`AutotuneController` is pure decision logic: it is fed one :class:`AutotuneSample`
per tick (delivered items/s, process CPU, RSS, and per stage its concurrency and how full
its input and output queues were) and answers which stages to resize. It changes one stage
at a time and keeps a change only if delivered throughput rises by more than ``min_gain``,
so every kept change is an improvement and the configuration cannot cycle. The
:class:`Autotuner` thread, owned by the pipeline's runtime, measures and applies.
See docs/autotune.md for the algorithm in words.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._channel import Channel

if TYPE_CHECKING:
    from ._node import OpStage

__all__ = [
    "AutotuneConfig",
    "AutotuneController",
    "AutotuneSample",
    "Autotuner",
    "StageSample",
    "cpu_count",
    "read_rss",
]

_LG = logging.getLogger("torch_spdl.pipeline.autotune")

DEFAULT_CPU_BUDGET = 0.4
DEFAULT_MAX_THREADS = 64
DEFAULT_MAX_COROUTINES = 256


@dataclass(frozen=True)
class AutotuneConfig:
    """The controller's knobs.

    ``cpu_budget``: the most process CPU time per second, as a fraction of the cores this
    process may use (0.4 on 8 cores: 3.2 cores). ``memory_limit``: the most resident memory
    in bytes (None: no bound). A tick is ``interval`` seconds; after each change the first
    ``settle_ticks`` are ignored and the next ``measure_ticks`` averaged. A change is kept
    when throughput rises by more than ``min_gain``; at a held configuration, a shift of
    more than ``drift`` for ``drift_windows`` windows in a row starts a new exploration.
    The process may exceed the CPU budget by ``cpu_tolerance`` (relative) before stages
    are shrunk, a band that keeps grow and shrink decisions apart. A stage is a bottleneck
    when its input queue is fuller than its output queue by ``bottleneck_margin``.
    """

    cpu_budget: float = DEFAULT_CPU_BUDGET
    memory_limit: int | None = None
    interval: float = 0.1
    settle_ticks: int = 1
    measure_ticks: int = 3
    min_gain: float = 0.03
    drift: float = 0.2
    drift_windows: int = 2
    cpu_tolerance: float = 0.1
    bottleneck_margin: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.cpu_budget <= 1:
            raise ValueError(
                f"cpu_budget must be a fraction of the machine's cores in (0, 1], "
                f"got {self.cpu_budget!r}"
            )
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError(
                f"memory_limit must be a positive number of bytes, got {self.memory_limit!r}"
            )
        if self.interval <= 0:
            raise ValueError(f"the autotune interval must be positive, got {self.interval!r}")
        if self.measure_ticks < 1 or self.settle_ticks < 0:
            raise ValueError("measure_ticks must be >= 1 and settle_ticks >= 0")


@dataclass(frozen=True)
class StageSample:
    """One stage over one tick. Occupancies are 0 (empty) to 1 (full)."""

    name: str
    concurrency: int
    max_concurrency: int  # the concurrency of a fixed stage
    tunable: bool
    in_occupancy: float
    out_occupancy: float


@dataclass(frozen=True)
class AutotuneSample:
    """The whole pipeline over one tick."""

    throughput: float  # items/s delivered to the consumer
    cpu: float  # process CPU time / (wall time * cores)
    rss: int | None  # resident bytes, None if unknown
    stages: tuple[StageSample, ...]


class AutotuneController:
    """Decides concurrency changes from samples; holds no thread and reads no clock.

    Phases: ``baseline`` (measure the current configuration), ``trial`` (one stage was
    resized; keep it or revert it), ``steady`` (nothing to try; watch for a workload
    change or for going over budget).
    """

    def __init__(self, config: AutotuneConfig | None = None) -> None:
        self.config = config or AutotuneConfig()
        self.phase = "baseline"
        self._skip = self.config.settle_ticks
        self._window: list[AutotuneSample] = []
        self._base = 0.0  # throughput of the configuration held
        self._trial: tuple[str, int, int] | None = None  # stage, old, new
        self._trimmed: set[str] = set()  # stages whose trim was tried at this configuration
        self._undo: list[tuple[str, int]] = []  # kept growths, newest last
        self._ceiling: dict[str, int] = {}  # a concurrency known not to help, per stage
        self._conc: dict[str, int] = {}
        self._drifted = 0
        self._over_windows = 0
        self.decisions: list[str] = []  # what was decided and why, for logs and tests

    @property
    def baseline(self) -> float:
        """The throughput of the configuration currently held."""
        return self._base

    def step(self, sample: AutotuneSample) -> dict[str, int]:
        """Take one tick's sample; return ``{stage name: new concurrency}`` to apply."""
        for s in sample.stages:
            self._conc.setdefault(s.name, s.concurrency)
        if self._skip > 0:
            self._skip -= 1
            return {}
        self._window.append(sample)
        if len(self._window) < self.config.measure_ticks:
            return {}
        window, self._window = self._window, []
        tput = sum(s.throughput for s in window) / len(window)
        cpu = sum(s.cpu for s in window) / len(window)
        rss = max((s.rss for s in window if s.rss is not None), default=None)
        latest = window[-1]
        if self.phase == "trial":
            return self._judge(tput, cpu, rss, latest)
        if self.phase == "steady":
            return self._watch(tput, cpu, rss, latest)
        self._base = tput
        return self._decide(cpu, rss, latest)

    # -- decisions -------------------------------------------------------------------------
    def _note(self, message: str) -> None:
        self.decisions.append(message)
        _LG.debug("autotune: %s", message)

    def _over_memory(self, rss: int | None) -> bool:
        limit = self.config.memory_limit
        return limit is not None and rss is not None and rss > limit

    def _over(self, cpu: float, rss: int | None) -> bool:
        cfg = self.config
        return cpu > cfg.cpu_budget * (1 + cfg.cpu_tolerance) or self._over_memory(rss)

    def _apply(self, changes: dict[str, int]) -> dict[str, int]:
        self._conc.update(changes)
        self._skip = self.config.settle_ticks
        return changes

    def _decide(self, cpu: float, rss: int | None, latest: AutotuneSample) -> dict[str, int]:
        if self._over(cpu, rss):
            return self._shrink(cpu, rss, latest)
        if cpu >= self.config.cpu_budget or self._over_memory(rss):
            self._note(f"at the CPU budget ({cpu:.0%}): hold")
            return self._hold()
        proposal = self._propose(latest) or self._propose_trim(latest)
        if proposal is None:
            return self._hold()
        name, old, new = proposal
        self._trial = proposal
        self.phase = "trial"
        self._note(f"try {name}: {old} -> {new} (throughput {self._base:.1f}/s)")
        return self._apply({name: new})

    def _propose_trim(self, latest: AutotuneSample) -> tuple[str, int, int] | None:
        """Nothing left to grow: try a quarter less of the tunable stage that waits most on
        its input. On a busy machine surplus workers cost CPU that the bottleneck could use;
        the trim is kept only if throughput rises, like any other trial."""
        stages = [
            s
            for s in latest.stages
            if s.tunable and s.name not in self._trimmed and self._conc.get(s.name, 1) > 1
        ]
        if not stages:
            return None
        s = min(stages, key=lambda s: s.in_occupancy)
        self._trimmed.add(s.name)
        cur = self._conc.get(s.name, s.concurrency)
        return s.name, cur, cur - max(1, cur // 4)

    def _propose(self, latest: AutotuneSample) -> tuple[str, int, int] | None:
        """The bottleneck among tunable stages and the concurrency to try for it."""
        margin = self.config.bottleneck_margin
        best: StageSample | None = None
        for s in latest.stages:
            if not s.tunable:
                continue
            score = s.in_occupancy - s.out_occupancy
            if score >= margin and (best is None or score > best.in_occupancy - best.out_occupancy):
                best = s
        if best is None:
            return None
        cur = self._conc.get(best.name, best.concurrency)
        ceiling = min(
            self._ceiling.get(best.name, best.max_concurrency + 1), best.max_concurrency + 1
        )
        if ceiling > best.max_concurrency and cur * 2 <= best.max_concurrency:
            new = cur * 2  # nothing known above: grow multiplicatively
        else:
            new = cur + (ceiling - cur) // 2  # bisect towards what did not help
            if new <= cur or (ceiling - cur) * 4 <= cur:
                return None  # saturated: the bottleneck cannot usefully grow
        return best.name, cur, min(new, best.max_concurrency)

    def _judge(
        self, tput: float, cpu: float, rss: int | None, latest: AutotuneSample
    ) -> dict[str, int]:
        assert self._trial is not None
        name, old, new = self._trial
        self._trial = None
        gain = (tput - self._base) / self._base if self._base > 0 else (1.0 if tput > 0 else 0.0)
        within = cpu <= self.config.cpu_budget and not self._over_memory(rss)
        trim = new < old
        if gain > self.config.min_gain and within:
            self._note(f"keep {name}={new}: {self._base:.1f} -> {tput:.1f}/s ({gain:+.0%})")
            self._base = tput
            if trim:  # growing back is known to be worse: that is the stage's ceiling now
                self._ceiling[name] = old
            else:
                self._undo.append((name, old))
                self._ceiling = {k: v for k, v in self._ceiling.items() if k == name}
            self._trimmed.clear()
            self.phase = "baseline"
            return self._decide(cpu, rss, latest)
        why = f"gain {gain:+.0%}" if within else f"over budget (CPU {cpu:.0%})"
        self._note(f"revert {name} to {old}: {why}")
        # Over budget: the limit lies between old and new, so bisect towards it later. No
        # gain from old to new: throughput is concave in concurrency, so nothing in
        # between gains either; the stage is saturated at old (no bisection trials).
        if not trim:
            limit = new if not within else old + 1
            self._ceiling[name] = min(limit, self._ceiling.get(name, limit))
        revert = self._apply({name: old})
        self.phase = "baseline"
        if not within:
            return revert
        following = self._decide(cpu, rss, latest)  # the next bottleneck, or hold
        return {**revert, **following}

    def _shrink(self, cpu: float, rss: int | None, latest: AutotuneSample) -> dict[str, int]:
        """Over the CPU budget or memory limit: undo the newest kept growth."""
        what = f"CPU {cpu:.0%}" if not self._over_memory(rss) else f"RSS {rss} bytes"
        if self._undo:
            name, prev = self._undo.pop()
        else:
            tunable = [s for s in latest.stages if s.tunable and self._conc.get(s.name, 1) > 1]
            if not tunable:
                self._note(f"over budget ({what}) with every tunable stage at 1: hold")
                return self._hold()
            top = max(tunable, key=lambda s: self._conc.get(s.name, s.concurrency))
            name, prev = top.name, max(1, self._conc.get(top.name, top.concurrency) // 2)
        cur = self._conc.get(name, prev)
        self._ceiling[name] = min(cur, self._ceiling.get(name, cur))
        self._note(f"shrink {name}: {cur} -> {prev} (over budget: {what})")
        self.phase = "baseline"
        return self._apply({name: prev})

    def _hold(self) -> dict[str, int]:
        self.phase = "steady"
        self._drifted = 0
        self._over_windows = 0
        return {}

    def _watch(
        self, tput: float, cpu: float, rss: int | None, latest: AutotuneSample
    ) -> dict[str, int]:
        # Holding: shrink only when two windows in a row are over, so that one noisy CPU
        # reading at the edge of the budget does not cost a worker for good.
        self._over_windows = self._over_windows + 1 if self._over(cpu, rss) else 0
        if self._over_windows >= 2:
            self._over_windows = 0
            return self._shrink(cpu, rss, latest)
        base = self._base
        shift = abs(tput - base) / base if base > 0 else (1.0 if tput > 0 else 0.0)
        self._drifted = self._drifted + 1 if shift > self.config.drift else 0
        if self._drifted < self.config.drift_windows:
            return {}
        self._note(f"workload changed: {base:.1f} -> {tput:.1f}/s; explore again")
        self._ceiling.clear()
        self._trimmed.clear()
        self._base = tput
        self.phase = "baseline"
        return self._decide(cpu, rss, latest)


# -- measuring ---------------------------------------------------------------------------
def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_rss() -> int | None:
    """Resident memory of this process in bytes (``/proc/self/statm``; else peak RSS)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return None


def _occupancy(channel: Channel[Any], gets: int, depth_sum: int) -> float:
    """How full ``channel`` was over a tick, seen by its reader; 0 for an unbounded one."""
    cap = channel.capacity
    if not cap:
        return 0.0
    if gets > 0:
        return min((depth_sum / gets) / max(cap - 1, 1), 1.0)
    return min(len(channel) / cap, 1.0)


class Autotuner:
    """The thread that measures the pipeline every tick and applies the controller's answers."""

    def __init__(
        self, stages: Sequence[OpStage], sink: Channel[Any], config: AutotuneConfig
    ) -> None:
        self.stages = list(stages)
        self.sink = sink
        self._by_name = {s.name: s for s in self.stages}
        self._channels = [s.inbox for s in self.stages] + [sink]  # each stage's input, sink
        self.controller = AutotuneController(config)
        self._cores = cpu_count()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="torch_spdl-autotune", daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def _raw(self) -> tuple[float, float, list[tuple[int, int]]]:
        times = os.times()
        chans = [(c.n_gets, c.depth_sum) for c in self._channels]
        return time.perf_counter(), times.user + times.system, chans

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # the tuner must never take the pipeline down
            _LG.exception("autotune stopped on an internal error; concurrency stays as is")

    def _loop(self) -> None:
        interval = self.controller.config.interval
        prev = self._raw()
        while not self._stop.wait(interval):
            if all(s.finished for s in self.stages):
                return
            cur = self._raw()
            sample = self._sample(prev, cur)
            prev = cur
            for name, n in self.controller.step(sample).items():
                self._by_name[name].set_concurrency(n)

    def _sample(self, prev: Any, cur: Any) -> AutotuneSample:
        (t0, cpu0, ch0), (t1, cpu1, ch1) = prev, cur
        wall = max(t1 - t0, 1e-9)
        occ = [
            _occupancy(c, g1 - g0, d1 - d0)
            for c, (g0, d0), (g1, d1) in zip(self._channels, ch0, ch1, strict=True)
        ]
        stages = tuple(
            StageSample(
                name=s.name,
                concurrency=s.concurrency,
                max_concurrency=s.most_workers,
                tunable=s.auto,
                in_occupancy=occ[i],
                out_occupancy=self._out_occupancy(i, occ),
            )
            for i, s in enumerate(self.stages)
        )
        return AutotuneSample(
            throughput=(ch1[-1][0] - ch0[-1][0]) / wall,
            cpu=(cpu1 - cpu0) / (wall * self._cores),
            rss=read_rss(),
            stages=stages,
        )

    def _out_occupancy(self, i: int, occ: list[float]) -> float:
        """The occupancy of stage ``i``'s output queue: the next stage's input, or the sink."""
        stage = self.stages[i]
        nxt = self.stages[i + 1] if i + 1 < len(self.stages) else None
        if nxt is not None and nxt.inbox is stage.outbox:
            return occ[i + 1]
        return occ[-1] if stage.outbox is self.sink else 0.0
