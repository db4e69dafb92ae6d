"""What the autotuner's phases share: one record of what is held, tried and known.

The controller's rules were added one on another, and each reads what the others left:
the climb bisects towards the ceiling a reverted model step set, a shrink undoes the
newest growth the climb kept, the look after the model's step skips the stages a
scale-back brought down. So the state lives here, in one place, and each phase
(``phase_model.py``, ``phase_climb.py``, ``judge.py``, ``budget.py``, ``phase_hold.py``)
is a set of functions that take it: a reader sees every field a rule may touch in one
list, and every phase's module shows only its own rules. The few reads every phase makes
(over a budget? what did a stage cost over the last window? how many workers does the
budget pay for?) are methods here, so no phase imports another for them.

Pure: no clock, no thread.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Literal

from .model import StageCost
from .vocabulary import AutotuneConfig, AutotuneSample, Decision

__all__ = ["Phase", "TunerState"]

_LG = logging.getLogger("torch_spdl.pipeline.autotune")

Phase = Literal["model", "look", "baseline", "trial", "steady"]


@dataclass
class TunerState:
    """Everything the controller knows between ticks, read and written by every phase.

    ``phase``: ``model`` (the first ticks: measure what items cost), ``look`` (a few short
    ticks after the model's step: measure again), ``baseline`` (measure the current
    configuration), ``trial`` (stages were resized; keep or revert), ``steady`` (nothing
    to try; watch for a workload change or for going over budget). ``cores`` is what
    ``cpu`` fractions are of.
    """

    config: AutotuneConfig
    cores: int
    phase: Phase = "model"
    skip: int = 0  # ticks still to ignore after a change (settling)
    window: list[AutotuneSample] = field(default_factory=list)
    last: list[AutotuneSample] = field(default_factory=list)  # the last full window
    base: float = 0.0  # throughput of the configuration held
    trial: dict[str, tuple[int, int]] = field(default_factory=dict)  # stage: (old, new)
    jump: bool = False  # the trial is the model's joint step
    unjudged: bool = False  # ... taken in the model phase: kept unless over a budget
    model_why: str = "first items"
    look_due: bool = False  # the model's step is to be looked at again once it is kept
    trimmed: set[str] = field(default_factory=set)  # trims tried at this configuration
    undo: list[tuple[str, int]] = field(default_factory=list)  # kept growths, newest last
    ceiling: dict[str, int] = field(default_factory=dict)  # known not to help, per stage
    unmodelled: set[str] = field(default_factory=set)  # model step failed: climb only
    cpu_bound: set[str] = field(default_factory=set)  # brought down for the CPU budget
    conc: dict[str, int] = field(default_factory=dict)  # the concurrency set, per stage
    floor: dict[str, int] = field(default_factory=dict)  # the least allowed, per stage
    least_wall: dict[str, float] = field(default_factory=dict)  # over the model's windows
    cheapest_hop: float = math.inf  # the process's CPU per item beyond the ops, least seen
    drifted: int = 0  # windows in a row whose throughput moved by more than ``drift``
    over_windows: int = 0  # windows in a row over a budget while holding
    decisions: list[str] = field(default_factory=list)  # what was decided and why, as text
    events: list[Decision] = field(default_factory=list)  # the same, structured

    # -- records and transitions -----------------------------------------------------------
    def note(self, message: str, stage: str | None = None, value: int | None = None) -> None:
        """Record one decision (text and structured) and log it."""
        self.decisions.append(message)
        self.events.append(Decision(stage, value, message))
        _LG.debug("autotune: %s", message)

    def apply(self, changes: dict[str, int]) -> dict[str, int]:
        """Take ``changes`` as the configuration set, and let it settle before measuring."""
        self.conc.update(changes)
        self.skip = self.config.settle_ticks
        return changes

    def grow_trial(self, name: str, old: int, new: int) -> None:
        """Stage ``name`` goes from ``old`` to ``new`` within the trial under way: the
        trial keeps the value it started from (an early step's, before the model's)."""
        self.trial[name] = (self.trial.get(name, (old, new))[0], new)

    def hold(self) -> dict[str, int]:
        """Nothing to try: hold the configuration and watch it (``phase_hold.py``)."""
        self.phase = "steady"
        self.drifted = 0
        self.over_windows = 0
        return {}

    # -- the budgets -----------------------------------------------------------------------
    def over_memory(self, rss: int | None) -> bool:
        limit = self.config.memory_limit
        return limit is not None and rss is not None and rss > limit

    def over(self, cpu: float, rss: int | None) -> bool:
        """Over the CPU budget by more than its tolerance, or over the memory limit."""
        cfg = self.config
        return cpu > cfg.cpu_budget * (1 + cfg.cpu_tolerance) or self.over_memory(rss)

    def affordable(self, name: str, workers: int, ratio: float) -> int:
        """How many workers of stage ``name``, now at ``workers``, keep its CPU at
        ``ratio`` times what it is: the workers scaled by the ratio, or fewer where Little's
        law at ``ratio`` times the stage's last measured rate asks for fewer (the CPU goes
        with the rate, and a stage whose rate stopped growing with its workers, because the
        event loop or the GIL is saturated, needs far fewer of them than the ratio says)."""
        n = math.floor(workers * ratio)
        c = self.last_cost(name)
        wall = c.least_wall or c.wall if c is not None else None
        if c is not None and wall and c.rate > 0:
            n = min(n, math.ceil(c.rate * ratio * wall - 1e-9))
        return n

    # -- what the stages cost ----------------------------------------------------------------
    def costs(self, window: list[AutotuneSample]) -> tuple[list[StageCost], float]:
        """Per-stage costs over ``window``, and the process's CPU over it in cores."""
        seconds = [s.seconds or self.config.interval for s in window]
        total = sum(seconds)
        cpu_cores = sum(s.cpu * t for s, t in zip(window, seconds, strict=True)) / total
        costs = []
        least = self.least_wall
        for i, s in enumerate(window[-1].stages):
            items = sum(w.stages[i].items for w in window)
            costed = sum(w.stages[i].costed for w in window)  # the items busy covers
            busy = sum(w.stages[i].busy for w in window)
            cpus = [w.stages[i].cpu_busy for w in window]
            cpu = None if any(c is None for c in cpus) or not costed else sum(cpus) / costed  # type: ignore[arg-type]
            # A window with no metered call finished, or costs that difference to zero or
            # below, measured nothing for this stage.
            measured = (
                s.measured and items > 0 and costed > 0 and busy > 0 and (cpu is None or cpu >= 0)
            )
            if measured:
                least[s.name] = min(least.get(s.name, math.inf), busy / costed)
            costs.append(
                StageCost(
                    name=s.name,
                    tunable=s.tunable,
                    concurrency=self.conc.get(s.name, s.concurrency),
                    bound=s.max_concurrency,
                    rate=items / total if measured else 0.0,
                    wall=busy / costed if measured else None,
                    cpu=cpu if measured else None,
                    least_wall=least.get(s.name),
                )
            )
        return costs, cpu_cores * self.cores

    def last_cost(self, name: str) -> StageCost | None:
        """Stage ``name``'s costs over the last full window (None: no window yet)."""
        costs = self.costs(self.last)[0] if self.last else []
        return next((c for c in costs if c.name == name), None)
