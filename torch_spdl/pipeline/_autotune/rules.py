"""The autotuner's decisions: a controller fed one sample per tick, answering what to resize.

Pure decision logic, kept apart from the thread that measures (``tuner.py``) so that
every rule can be tested on synthetic samples: it reads no clock and starts no thread.

1. **Model** (the first ticks, short ones): from the first items through each stage, its
   wall and CPU seconds per item, Little's law sizes every autotuned stage at once
   (``model.py``). The jump is judged like any trial: reverted if it breaks the
   memory limit or does not raise throughput, scaled back if it goes over the CPU budget.
   Once it is kept, the model looks again over a few more short ticks, at the new
   concurrency (the first items are few, and run cold), and grows what it under-sized.
2. **Hill-climb**: change one stage at a time (double the bottleneck, or bisect towards a
   value known not to help; trim a stage that waits on the others) and keep a change only
   if delivered throughput rises by more than ``min_gain`` within the budgets, so every
   kept change is an improvement and the configuration cannot cycle.
3. **Hold**: watch for going over a budget (shrink) or for a workload change (model again,
   then climb again).

Every decision is recorded as a :class:`Decision` (``events``), with its reason, which the
sampler thread forwards to the trace; ``decisions`` keeps the same as lines of text.
See docs/autotune.md for the algorithm in words.

Why this file is one piece (over 400 lines): it is one state machine. The phases share the
controller's state (the window of samples, the baseline, the trial under way, what is
known not to help), and each rule reads what the others left; split across modules they
would have to pass that state back and forth. Its data types are in
``vocabulary.py``, the sizing model in ``model.py``.
"""

from __future__ import annotations

import logging
import math

from .model import (
    StageCost,
    cores_cap,
    early_target,
    model_targets,
    only_waits,
    process_hop,
)
from .probes import cpu_count
from .vocabulary import (
    AutotuneConfig,
    AutotuneSample,
    Decision,
    StageSample,
)

__all__ = ["AutotuneController"]

_LG = logging.getLogger("torch_spdl.pipeline.autotune")

# The climb grows a stage to at most this many times the workers that use the CPU budget
# (:func:`cores_cap`): room for ops that also wait a little, or whose share was read low,
# but not for 18 decode threads on 2 cores, kept trial by trial for gains (over 3%) within
# a shared machine's noise, each costing a window.
_CLIMB_OVER_CORES = 2


class AutotuneController:
    """Decides concurrency changes from samples; holds no thread and reads no clock.

    Phases: ``model`` (the first ticks: measure what items cost), ``look`` (a few short
    ticks after the model's step: measure again), ``baseline`` (measure the current
    configuration), ``trial`` (stages were resized; keep or revert), ``steady``
    (nothing to try; watch for a workload change or for going over budget). ``cores`` is
    what ``cpu`` fractions are of (default: the cores this process may use).
    """

    def __init__(self, config: AutotuneConfig | None = None, *, cores: int | None = None) -> None:
        self.config = config or AutotuneConfig()
        self.cores = cores or cpu_count()
        self.phase = "model" if self.config.model else "baseline"
        self._skip = 0 if self.config.model else self.config.settle_ticks
        self._window: list[AutotuneSample] = []
        self._last: list[AutotuneSample] = []  # the last full window
        self._base = 0.0  # throughput of the configuration held
        self._trial: dict[str, tuple[int, int]] = {}  # stage: (old, new)
        self._jump = False  # the trial is the model's joint step
        self._unjudged = False  # ... taken in the model phase: kept unless over a budget
        self._model_why = "first items"
        self._look_due = False  # the model's step is to be looked at again once it is kept
        self._trimmed: set[str] = set()  # stages whose trim was tried at this configuration
        self._undo: list[tuple[str, int]] = []  # kept growths, newest last
        self._ceiling: dict[str, int] = {}  # a concurrency known not to help, per stage
        self._unmodelled: set[str] = set()  # stages whose model step failed: climb only
        self._cpu_bound: set[str] = set()  # stages brought down for the CPU budget
        self._conc: dict[str, int] = {}
        self._floor: dict[str, int] = {}
        self._least_wall: dict[str, float] = {}  # per stage, over the model's windows
        self._cheapest_hop = math.inf  # the process's CPU per item beyond the ops, least seen
        self._drifted = 0
        self._over_windows = 0
        self.decisions: list[str] = []  # what was decided and why, as text
        self.events: list[Decision] = []  # the same, structured (for the trace)

    @property
    def baseline(self) -> float:
        """The throughput of the configuration currently held."""
        return self._base

    @property
    def interval(self) -> float:
        """How long the next tick should be: short while the model measures, and while
        its step is checked against the budgets (the check needs no throughput to beat, so
        a few short ticks tell; a step over the CPU budget is scaled back within 0.1 s)."""
        if self.phase == "model":
            return self.config.model_interval
        if self.phase == "look" or (self.phase == "trial" and self._unjudged):
            return self.config.check_interval
        return self.config.interval

    def held(self) -> dict[str, int]:
        """The configuration to remember: a one-stage trial counts as not taken."""
        conf = dict(self._conc)
        if not self._jump:
            conf.update({name: old for name, (old, _) in self._trial.items()})
        return conf

    def step(self, sample: AutotuneSample) -> dict[str, int]:
        """Take one tick's sample; return ``{stage name: new concurrency}`` to apply."""
        for s in sample.stages:
            self._conc.setdefault(s.name, s.concurrency)
            self._floor[s.name] = s.min_concurrency
        if self.phase == "model":
            changes = self._model_step(sample)
            if self.phase == "model" or changes:
                return changes
            self._skip = self.config.settle_ticks  # no model: climb, as before
        if self._skip > 0:
            self._skip -= 1
            return {}
        self._window.append(sample)
        checking = self.phase == "trial" and self._unjudged
        needed = self.config.check_ticks if checking else self.config.measure_ticks
        if self.phase == "look":
            needed = self.config.look_ticks
        if len(self._window) < needed:
            return {}
        window, self._window = self._window, []
        self._last = window
        tput = sum(s.throughput for s in window) / len(window)
        cpu = sum(s.cpu for s in window) / len(window)
        rss = max((s.rss for s in window if s.rss is not None), default=None)
        latest = window[-1]
        if self.phase == "trial":
            return self._judge(tput, cpu, rss, latest)
        if self.phase == "look":
            return self._look(cpu, rss)
        if self.phase == "steady":
            return self._watch(tput, cpu, rss, latest)
        self._base = tput
        return self._decide(cpu, rss, latest)

    # -- decisions -------------------------------------------------------------------------
    def _note(self, message: str, stage: str | None = None, value: int | None = None) -> None:
        self.decisions.append(message)
        self.events.append(Decision(stage, value, message))
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

    # -- the model -------------------------------------------------------------------------
    def _model_step(self, sample: AutotuneSample) -> dict[str, int]:
        tunable = [s for s in sample.stages if s.tunable]
        if not any(s.measured for s in tunable):
            self.phase = "baseline"  # nothing measures costs: hill-climb only
            return {}
        self._window.append(sample)
        done: dict[str, int] = {}
        for smp in self._window:
            for s in smp.stages:
                done[s.name] = done.get(s.name, 0) + s.costed
        ready = all(done.get(s.name, 0) >= self.config.model_items for s in tunable if s.measured)
        if not ready and len(self._window) < self.config.model_ticks:
            return self._early_step(sample)
        window, self._window = self._window, []
        if self._model_why == "first items":
            self._base = sum(s.throughput for s in window) / len(window)
        self.phase = "baseline"
        changes = self._jump_to_model(window, self._model_why)
        self._unjudged = self.phase == "trial"  # short ticks measure costs well, throughput not
        self._look_due = True
        if self.phase == "baseline":  # nothing to judge: look again at once
            self._look_due, self.phase = False, "look"
        return changes

    def _early_step(self, sample: AutotuneSample) -> dict[str, int]:
        """Before any of its items has finished, grow an async stage whose items in flight
        wait (:func:`early_target`): the model's step comes once they finish, a whole wait
        later, and a short epoch has lost that wait at the starting concurrency. Taken
        again each tick as the items age (when it asks for ``remodel_factor`` times more,
        or the bound); the model's step is then judged with what these steps did. None
        over the memory limit: items in flight hold memory before they cost CPU."""
        changes: dict[str, int] = {}
        if self._over_memory(sample.rss):
            return changes
        for i, s in enumerate(sample.stages):
            if not s.tunable or not s.pending:  # (pending: none of its items finished yet)
                continue
            cpus = [w.stages[i].cpu_busy for w in self._window]
            if any(c is None for c in cpus):
                continue
            target = early_target(
                pending=s.pending,
                age=s.pending_age,
                cpu=sum(cpus) / s.pending,  # type: ignore[arg-type]
                bound=s.max_concurrency,
                budget=self.config.cpu_budget * self.cores,
                stages=len(sample.stages),
            )
            if target is None:
                continue
            old = self._conc.get(s.name, s.concurrency)
            n = max(target.concurrency, self._floor.get(s.name, 1))
            if n <= old or (n < self.config.remodel_factor * old and n < s.max_concurrency):
                continue
            changes[s.name] = n
            self._grow_trial(s.name, old, n)
            self._note(f"early {s.name}: {old} -> {n} ({target.reason})", s.name, n)
        return self._apply(changes) if changes else {}

    def _grow_trial(self, name: str, old: int, new: int) -> None:
        """Stage ``name`` goes from ``old`` to ``new`` within the trial under way: the
        trial keeps the value it started from (an early step's, before the model's)."""
        self._trial[name] = (self._trial.get(name, (old, new))[0], new)

    def _costs(self, window: list[AutotuneSample]) -> tuple[list[StageCost], float]:
        """Per-stage costs over ``window``, and the process's CPU over it in cores."""
        seconds = [s.seconds or self.config.interval for s in window]
        total = sum(seconds)
        cpu_cores = sum(s.cpu * t for s, t in zip(window, seconds, strict=True)) / total
        costs = []
        least = self._least_wall
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
                    concurrency=self._conc.get(s.name, s.concurrency),
                    bound=s.max_concurrency,
                    rate=items / total if measured else 0.0,
                    wall=busy / costed if measured else None,
                    cpu=cpu if measured else None,
                    least_wall=least.get(s.name),
                )
            )
        return costs, cpu_cores * self.cores

    def _model_changes(
        self, window: list[AutotuneSample], *, start: bool = False, remember: bool = True
    ) -> dict[str, tuple[int, str]]:
        costs, cpu_cores = self._costs(window)
        if not start and remember:
            self._cheapest_hop = min(self._cheapest_hop, process_hop(costs, cpu_cores))
        # A full sink says the consumer sets the pace, but not over the first items: a
        # stage started at 256 coroutines (where the last build left it) finishes its first
        # 256 items at once, fills the sink, and its rate over the first few ms is mostly
        # the wait for them (3,000/s): sized for that "consumer", it went 256 -> 23.
        full = window[-1].stages[-1].out_occupancy if window[-1].stages and not start else 0.0
        targets = model_targets(
            costs,
            cpu_used=cpu_cores,
            budget=self.config.cpu_budget * self.cores,
            sink_occupancy=full,
            price_process=not start,
            cheapest_hop=self._cheapest_hop,
            cores=self.cores,
        )
        out = {}
        for name, (n, why) in targets.items():
            if name in self._ceiling:
                n = min(n, self._ceiling[name] - 1)
            out[name] = (max(n, self._floor.get(name, 1)), why)
        return out

    def _jump_to_model(self, window: list[AutotuneSample], why: str) -> dict[str, int]:
        """Size every measured autotuned stage by the model, as one trial."""
        if self._over_memory(max((s.rss for s in window if s.rss is not None), default=None)):
            self._note(f"model ({why}): over the memory limit, no jump")
            return {}
        changes: dict[str, int] = {}
        start = why == "first items"
        for name, (n, reason) in self._model_changes(window, start=start).items():
            old = self._conc.get(name, 1)
            n = max(1, n)
            if n == old:
                continue
            changes[name] = n
            self._grow_trial(name, old, n)  # judged with the early steps, if any
            self._note(f"model {name}: {old} -> {n} ({why}: {reason})", name, n)
        if not self._trial:
            self._note(f"model ({why}): the concurrency held is right")
            return {}
        if not changes:
            self._note(f"model ({why}): the early steps were right")
        self._jump = True
        self.phase = "trial"
        return self._apply(changes)

    # -- the climb -------------------------------------------------------------------------
    def _decide(self, cpu: float, rss: int | None, latest: AutotuneSample) -> dict[str, int]:
        self._look_due = False  # a full window was measured: the climb's model looks now
        if self._over(cpu, rss):
            return self._shrink(cpu, rss, latest)
        if cpu >= self.config.cpu_budget or self._over_memory(rss):
            self._note(f"at the CPU budget ({cpu:.0%}): hold")
            return self._hold()
        if self.config.model and self._last:
            grow = self._model_growth(cpu, self._last)
            if grow:
                return grow
        proposal = self._propose(latest, cpu) or self._propose_trim(latest)
        if proposal is None:
            return self._hold()
        name, old, new = proposal
        self._trial = {name: (old, new)}
        self._jump = False
        self.phase = "trial"
        self._note(f"try {name}: {old} -> {new} (throughput {self._base:.1f}/s)", name, new)
        return self._apply({name: new})

    def _look(self, cpu: float, rss: int | None) -> dict[str, int]:
        """The model's step was kept: the model again, on the few short ticks just measured
        at the new concurrency, growing a stage that waits when it now asks
        ``remodel_factor`` times more of it (:meth:`_model_growth`), judged on short ticks
        like the step.

        The step's costs came from the first items: a few per stage, run cold. A decode's
        cold first items, priced at three times their cost, sized the I/O stage before it
        for a third of the rate; the climb's model saw it on its first full window, 0.35 s
        in, and a 3,000-item run of that pipeline lasts 0.9 s. Over 40 ms at the new
        concurrency, hundreds of items are measured warm.

        A stage that burns CPU is left to the climb, which grows it only for a gain: on a
        machine whose other processes leave this one 0.75 of its 2 cores, a decode's
        threads wait for cores, their wall time grows with their number, and Little's law
        for the 2 cores of the budget asks for more of them at each look (4 -> 7 -> 13 at
        the same rate). A stage brought down for the CPU budget is left to the full
        window too: its scale-back was measured on short ticks like these."""
        self.phase = "baseline"
        if self._over(cpu, rss) or cpu >= self.config.cpu_budget or not self._last:
            return {}
        budget = self.config.cpu_budget * self.cores
        waiting = {c.name for c in self._costs(self._last)[0] if only_waits(c, budget)}
        return self._model_growth(cpu, self._last, only=waiting)

    def _model_growth(
        self, cpu: float, window: list[AutotuneSample], *, only: set[str] | None = None
    ) -> dict[str, int]:
        """The model again, on ``window`` (costs per item fall as the rate rises: wake-ups
        amortise): a joint trial when it asks for at least ``remodel_factor`` times more
        of some stage. ``only`` (:meth:`_look`): the stages it may grow, over a window of a
        few short ticks, whose process CPU per item is not remembered as the cheapest hop,
        and whose growth is judged on short ticks.

        A stage brought down for the CPU budget is not modelled again, but it may grow
        back so, judged on short ticks, when the budget now pays for that much more of it
        (:meth:`_affordable`, within its ceiling): on 2 cores its CPU per item halves when
        the kernel puts the loop's thread and the consumer's back on one core, and a
        trial of the climb, judged on a full window, came after a 30,000-item run (0.75
        s) was over."""
        factor = self.config.remodel_factor
        changes: dict[str, int] = {}
        look = only is not None
        why = "look again" if look else "refine"
        for name, (n, reason) in self._model_changes(window, remember=not look).items():
            old = self._conc.get(name, 1)
            if only is not None and (
                name not in only or name in self._cpu_bound or name in self._unmodelled
            ):
                continue
            if name in self._cpu_bound and cpu > 0:
                paid = self._affordable(name, old, self.config.cpu_budget / cpu)
                if paid < n:
                    n, reason = paid, f"the CPU budget pays for {paid} at {cpu:.0%} now"
            elif name in self._unmodelled:
                continue
            if n >= factor * old or (n > old and n - old >= 8 and n >= 1.25 * old):
                changes[name] = n
                self._trial[name] = (old, n)
                self._note(f"model {name}: {old} -> {n} ({why}: {reason})", name, n)
        if changes:
            self._jump = True
            # growing back within the budget, or what the first items under-sized: kept
            # unless it goes over a budget (short ticks)
            self._unjudged = look or any(name in self._cpu_bound for name in changes)
            self.phase = "trial"
            self._apply(changes)
        return changes

    def _propose_trim(self, latest: AutotuneSample) -> tuple[str, int, int] | None:
        """Nothing left to grow: try a quarter less of the tunable stage that waits most on
        its input. On a busy machine surplus workers cost CPU that the bottleneck could use;
        the trim is kept only if throughput rises, like any other trial. The bottleneck
        itself is not trimmed: fewer of it can only deliver less, and the trial would cost a
        window of lower throughput for nothing. Nor is a stage whose fewer workers could
        not keep up with the rate it runs at, by Little's law at the least wall time per
        item seen (the queues' occupancy tells a bottleneck only roughly: a decode stage
        whose input queue was half full was trimmed from 2 workers to 1, for a window at
        -45%)."""
        margin = self.config.bottleneck_margin
        costs = {c.name: c for c in self._costs(self._last)[0]} if self._last else {}

        def keeps_up(name: str, n: int) -> bool:
            c = costs.get(name)
            wall = c.least_wall or c.wall if c is not None else None
            return c is None or not wall or c.rate <= 0 or n / wall >= c.rate

        stages = []
        for s in latest.stages:
            cur = self._conc.get(s.name, s.concurrency)
            if (
                s.tunable
                and s.name not in self._trimmed
                and cur > s.min_concurrency
                and s.in_occupancy - s.out_occupancy < margin  # not the bottleneck
                and keeps_up(s.name, _quarter_fewer(cur, s.min_concurrency))
            ):
                stages.append(s)
        if not stages:
            return None
        s = min(stages, key=lambda s: s.in_occupancy)
        self._trimmed.add(s.name)
        cur = self._conc.get(s.name, s.concurrency)
        return s.name, cur, _quarter_fewer(cur, s.min_concurrency)

    def _climb_cap(self, name: str) -> int | None:
        """The most workers the climb tries for stage ``name``: :data:`_CLIMB_OVER_CORES`
        times what uses the CPU budget at the CPU share measured (None: not measured)."""
        c = self._last_cost(name)
        budget = self.config.cpu_budget * self.cores
        cap = None if c is None else cores_cap(c, budget, cores=self.cores)
        return None if cap is None else _CLIMB_OVER_CORES * cap

    def _propose(self, latest: AutotuneSample, cpu: float) -> tuple[str, int, int] | None:
        """The bottleneck among tunable stages and the concurrency to try for it.

        A stage brought down for the CPU budget (its CPU is known to go with it) grows back
        no further than what the budget pays for at the CPU per item just measured
        (:meth:`_affordable`): a trial predicted over the budget would be reverted for it,
        at the cost of a window, and leave the stage where it was. Near the budget the
        trial is then the headroom's worth (a stage at 35% of a 40% budget tries about a
        seventh more, not the bisection's quarter), and it is kept if it fits. Other
        stages are not capped so: the process's CPU may be mostly outside them (a training
        step), and growing them costs little of it. Every stage whose CPU share is
        measured grows to at most :data:`_CLIMB_OVER_CORES` times the workers that use the
        budget (:meth:`_climb_cap`)."""
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
        if cpu > 0 and best.name in self._cpu_bound:
            new = min(new, self._affordable(best.name, cur, self.config.cpu_budget / cpu))
            if new <= cur:
                return None  # the budget pays for no more of it
        most = self._climb_cap(best.name)
        if most is not None and new > most:
            new = most
            if new <= cur:
                return None  # more threads would only wait for the cores
        return best.name, cur, min(new, best.max_concurrency)

    def _judge(
        self, tput: float, cpu: float, rss: int | None, latest: AutotuneSample
    ) -> dict[str, int]:
        trial, jump, unjudged = self._trial, self._jump, self._unjudged
        self._trial, self._jump, self._unjudged = {}, False, False
        gain = (tput - self._base) / self._base if self._base > 0 else (1.0 if tput > 0 else 0.0)
        within = cpu <= self.config.cpu_budget and not self._over_memory(rss)
        if jump and not self._over_memory(rss):
            if self._over(cpu, rss):
                return self._scale_back(trial, tput, cpu, recheck=unjudged)
            if cpu > self.config.cpu_budget and self._trims(trial, cpu):
                # Within the band but over the budget: the model's step aims at the budget,
                # and the band is for what is held (a window's noise must not shrink a
                # setting that was right), not room to step into. Kept at the band's edge,
                # a short run ends over it once the start-up's CPU is added.
                return self._scale_back(trial, tput, cpu, recheck=unjudged, fine=True)
            within = True
            if unjudged:  # its base was a few short ticks: noise, not a rate to beat
                gain = max(gain, self.config.min_gain * 2)
        if gain > self.config.min_gain and within:
            what = (
                "the model's step" if jump else ", ".join(f"{k}={n}" for k, (_, n) in trial.items())
            )
            if unjudged:
                self._note(f"keep {what}: {tput:.1f}/s within the budgets")
            else:
                self._note(f"keep {what}: {self._base:.1f} -> {tput:.1f}/s ({gain:+.0%})")
            self._base = tput
            for name, (old, new) in trial.items():
                if new < old:  # growing back is known to be worse: the stage's ceiling now
                    self._ceiling[name] = old
                elif not jump:
                    self._undo.append((name, old))
                    self._ceiling = {k: v for k, v in self._ceiling.items() if k == name}
            self._trimmed.clear()
            self.phase = "baseline"
            if unjudged and self._look_due:
                self._look_due, self.phase = False, "look"
            if unjudged:
                # A few short ticks catch a step that is over the budget at once, not one
                # that drifts over it as the pipeline settles (on 2 cores, threads sharing
                # one core hand the GIL over cheaply until the scheduler moves one to the
                # other core, and the CPU per item doubles). So the next full window is the
                # step's baseline and its second judgment: over the budget there, it is
                # scaled down at once, not after two held windows.
                return {}
            return self._decide(cpu, rss, latest)
        if within:
            why = f"gain {gain:+.0%}"
        elif self._over_memory(rss):
            why = f"over the memory limit (RSS {rss} bytes)"
        else:
            why = f"over budget (CPU {cpu:.0%})"
        revert: dict[str, int] = {}
        for name, (old, new) in trial.items():
            self._note(f"revert {name} to {old}: {why}", name, old)
            if jump:  # the model was wrong about this stage: the climb takes it from here
                self._unmodelled.add(name)
            # Over budget: the limit lies between old and new, so bisect towards it later. No
            # gain from old to new: throughput is concave in concurrency, so nothing in
            # between gains either; the stage is saturated at old (no bisection trials).
            if new > old:
                limit = new if not within else old + 1
                self._ceiling[name] = min(limit, self._ceiling.get(name, limit))
            revert[name] = old
        self._apply(revert)
        self.phase = "baseline"
        if not within:
            return revert
        following = self._decide(cpu, rss, latest)  # the next bottleneck, or hold
        return {**revert, **following}

    def _trims(self, trial: dict[str, tuple[int, int]], cpu: float) -> bool:
        """Whether a ``fine`` scale-back (:meth:`_scale_back`) changes any stage."""
        ratio = self.config.cpu_budget / cpu
        return any(old < new and _cut_by(new, ratio) < new for old, new in trial.values())

    def _scale_back(
        self,
        trial: dict[str, tuple[int, int]],
        tput: float,
        cpu: float,
        *,
        recheck: bool,
        fine: bool = False,
    ) -> dict[str, int]:
        """The model's step went over the CPU budget: bring the grown stages down to what
        the budget pays for (:meth:`_affordable`), keep the rest. ``fine`` (the step is
        within the tolerance band): trim them by the excess alone, rounded up, so a stage
        of a few workers loses none for an excess smaller than one of them, and with no
        Little's law on the rate of short ticks, which is still the start-up's.

        With ``recheck`` (the step was judged on short ticks), the scaled-back step is
        judged again the same way: the CPU per item is not proportional everywhere (on 2
        cores it about doubles once the load spreads the pipeline's threads over both
        cores), and a scale-back that is still over the budget is scaled back again within
        a tenth of a second, not after a full window."""
        ratio = self.config.cpu_budget / cpu
        changes: dict[str, int] = {}
        for name, (old, new) in trial.items():
            if new <= old:
                continue
            if fine:
                n = max(old, _cut_by(new, ratio))
            else:
                n = max(old, min(new - 1, self._affordable(name, new, ratio)))
            self._ceiling[name] = min(new, self._ceiling.get(name, new), _above(n))
            self._unmodelled.add(name)
            self._cpu_bound.add(name)
            if n != new:
                changes[name] = n
                self._note(
                    f"scale {name} back: {new} -> {n} "
                    f"(CPU {cpu:.0%}, over the budget of {self.config.cpu_budget:.0%})",
                    name,
                    n,
                )
        self._base = tput * ratio
        self.phase = "baseline"
        if changes and recheck:
            self._trial = {name: (trial[name][0], n) for name, n in changes.items()}
            self._jump = self._unjudged = True
            self.phase = "trial"
        return self._apply(changes)

    def _affordable(self, name: str, workers: int, ratio: float) -> int:
        """How many workers of stage ``name``, now at ``workers``, keep its CPU at
        ``ratio`` times what it is: the workers scaled by the ratio, or fewer where Little's
        law at ``ratio`` times the stage's last measured rate asks for fewer (the CPU goes
        with the rate, and a stage whose rate stopped growing with its workers, because the
        event loop or the GIL is saturated, needs far fewer of them than the ratio says)."""
        n = math.floor(workers * ratio)
        c = self._last_cost(name)
        wall = c.least_wall or c.wall if c is not None else None
        if c is not None and wall and c.rate > 0:
            n = min(n, math.ceil(c.rate * ratio * wall - 1e-9))
        return n

    def _last_cost(self, name: str) -> StageCost | None:
        """Stage ``name``'s costs over the last full window (None: no window yet)."""
        costs = self._costs(self._last)[0] if self._last else []
        return next((c for c in costs if c.name == name), None)

    def _shrink(self, cpu: float, rss: int | None, latest: AutotuneSample) -> dict[str, int]:
        """Over the CPU budget or memory limit: undo the newest kept growth; without one,
        shrink the stage that uses the most CPU, by the excess."""
        memory = self._over_memory(rss)
        what = f"CPU {cpu:.0%}" if not memory else f"RSS {rss} bytes"
        if self._undo:
            name, prev = self._undo.pop()
        else:
            tunable = [
                s
                for s in latest.stages
                if s.tunable and self._conc.get(s.name, 1) > s.min_concurrency
            ]
            if not tunable:
                self._note(f"over budget ({what}) with every tunable stage at its least: hold")
                return self._hold()

            def load(s: StageSample) -> tuple[float, int]:
                per_item = s.cpu_busy / s.costed if s.cpu_busy is not None and s.costed else 0.0
                return per_item * s.items, self._conc.get(s.name, s.concurrency)

            top = max(tunable, key=load)
            name = top.name
            cur = self._conc.get(name, top.concurrency)
            if memory or cpu <= 0:
                fewer = cur // 2
            else:
                fewer = self._affordable(name, cur, self.config.cpu_budget / cpu)
                self._cpu_bound.add(name)
            prev = max(top.min_concurrency, 1, min(cur - 1, fewer))
            self._unmodelled.add(name)  # the model sized it over the budget: climb only
        cur = self._conc.get(name, prev)
        self._ceiling[name] = min(cur, self._ceiling.get(name, cur), _above(prev))
        self._note(f"shrink {name}: {cur} -> {prev} (over budget: {what})", name, prev)
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
        # reading at the edge of the budget does not cost a worker for good; or one window
        # far over (twice the tolerance: 48% against a 40% budget), which is no edge (on
        # 2 cores, the CPU per item doubles once the threads spread over both cores, and
        # over a run of 0.75 s two windows of it were most of the run).
        far = cpu > self.config.cpu_budget * (1 + 2 * self.config.cpu_tolerance)
        self._over_windows = self._over_windows + 1 if self._over(cpu, rss) else 0
        if self._over_windows >= 2 or far:
            self._over_windows = 0
            return self._shrink(cpu, rss, latest)
        base = self._base
        shift = abs(tput - base) / base if base > 0 else (1.0 if tput > 0 else 0.0)
        self._drifted = self._drifted + 1 if shift > self.config.drift else 0
        if not self._drifted:
            return {}
        modelled = self.config.model and any(s.measured for s in latest.stages if s.tunable)
        if self._drifted < self.config.drift_windows and not modelled:
            return {}
        self._note(f"workload changed: {base:.1f} -> {tput:.1f}/s; explore again")
        self._ceiling.clear()
        self._unmodelled.clear()
        self._cpu_bound.clear()
        self._trimmed.clear()
        self._least_wall.clear()
        self._base = tput
        if modelled:
            # Measure the items' costs afresh (short ticks, all after the change: the window
            # just seen may straddle it), then size by the model; a shift that was noise
            # leaves the model where it was, at the cost of a few short ticks.
            self.phase = "model"
            self._model_why = "workload changed"
            return {}
        self.phase = "baseline"
        return self._decide(cpu, rss, latest)


def _cut_by(workers: int, ratio: float) -> int:
    """``workers`` scaled by ``ratio`` (at most 1), rounded up."""
    return math.ceil(workers * ratio - 1e-9)


def _above(n: int) -> int:
    """The ceiling of a stage brought down to ``n`` workers for a budget: the climb may
    try a quarter more (the bisection's one step towards half more), not the way back up
    to where it was over. Its CPU per item is not proportional to its workers (on 2 cores
    it about doubles once the load spreads the pipeline's threads over both cores), so
    what lies above that was over the budget when measured, and a trial there would
    spend a whole window over it again."""
    return max(n + 2, n + n // 2)


def _quarter_fewer(n: int, floor: int) -> int:
    """A quarter fewer than ``n`` workers (at least one fewer), never below ``floor``."""
    return max(floor, n - max(1, n // 4))
