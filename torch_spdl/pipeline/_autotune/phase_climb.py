"""The autotuner's second phase: the hill-climb, one stage at a time.

After a full window at the configuration held (the ``baseline`` phase), :func:`decide`
picks the next trial: shrink if over a budget (``budget.py``), hold at the CPU budget, let
the model grow what it now finds under-sized (``phase_model.py``), else double the
bottleneck or bisect towards a value known not to help (:func:`_propose`), else trim a
stage that waits on the others (:func:`_propose_trim`). ``judge.py`` keeps a trial only
if delivered throughput rises by more than ``min_gain`` within the budgets, so every kept
change is an improvement and the configuration cannot cycle. With nothing to try, the
controller holds (``phase_hold.py``).

These rules read and write the shared :class:`TunerState`. Pure: no clock, no thread.
"""

from __future__ import annotations

from .budget import shrink
from .model import cores_cap
from .phase_model import model_growth
from .tuning_state import TunerState
from .vocabulary import AutotuneSample, StageSample

__all__ = ["decide"]

# The climb grows a stage to at most this many times the workers that use the CPU budget
# (:func:`cores_cap`): room for ops that also wait a little, or whose share was read low,
# but not for 18 decode threads on 2 cores, kept trial by trial for gains (over 3%) within
# a shared machine's noise, each costing a window.
_CLIMB_OVER_CORES = 2


def decide(st: TunerState, cpu: float, rss: int | None, latest: AutotuneSample) -> dict[str, int]:
    """A full window was measured at the configuration held: the next trial, or hold."""
    st.look_due = False  # a full window was measured: the climb's model looks now
    if st.over(cpu, rss):
        return shrink(st, cpu, rss, latest)
    if cpu >= st.config.cpu_budget or st.over_memory(rss):
        st.note(f"at the CPU budget ({cpu:.0%}): hold")
        return st.hold()
    if st.config.model and st.last:
        grow = model_growth(st, cpu, st.last)
        if grow:
            return grow
    proposal = _propose(st, latest, cpu) or _propose_trim(st, latest)
    if proposal is None:
        return st.hold()
    name, old, new = proposal
    st.trial = {name: (old, new)}
    st.jump = False
    st.phase = "trial"
    st.note(f"try {name}: {old} -> {new} (throughput {st.base:.1f}/s)", name, new)
    return st.apply({name: new})


def _propose(st: TunerState, latest: AutotuneSample, cpu: float) -> tuple[str, int, int] | None:
    """The bottleneck among tunable stages and the concurrency to try for it.

    A stage brought down for the CPU budget (its CPU is known to go with it) grows back
    no further than what the budget pays for at the CPU per item just measured
    (:meth:`TunerState.affordable`): a trial predicted over the budget would be reverted
    for it, at the cost of a window, and leave the stage where it was. Near the budget the
    trial is then the headroom's worth (a stage at 35% of a 40% budget tries about a
    seventh more, not the bisection's quarter), and it is kept if it fits. Other
    stages are not capped so: the process's CPU may be mostly outside them (a training
    step), and growing them costs little of it. Every stage whose CPU share is
    measured grows to at most :data:`_CLIMB_OVER_CORES` times the workers that use the
    budget (:func:`_climb_cap`)."""
    best = _bottleneck(st, latest)
    if best is None:
        return None
    cur = st.conc.get(best.name, best.concurrency)
    ceiling = min(st.ceiling.get(best.name, best.max_concurrency + 1), best.max_concurrency + 1)
    if ceiling > best.max_concurrency and cur * 2 <= best.max_concurrency:
        new = cur * 2  # nothing known above: grow multiplicatively
    else:
        new = cur + (ceiling - cur) // 2  # bisect towards what did not help
        if new <= cur or (ceiling - cur) * 4 <= cur:
            return None  # saturated: the bottleneck cannot usefully grow
    if cpu > 0 and best.name in st.cpu_bound:
        new = min(new, st.affordable(best.name, cur, st.config.cpu_budget / cpu))
        if new <= cur:
            return None  # the budget pays for no more of it
    most = _climb_cap(st, best.name)
    if most is not None and new > most:
        new = most
        if new <= cur:
            return None  # more threads would only wait for the cores
    return best.name, cur, min(new, best.max_concurrency)


def _bottleneck(st: TunerState, latest: AutotuneSample) -> StageSample | None:
    """The tunable stage whose input queue is fullest against its output's, by at least
    ``bottleneck_margin`` (None: no such stage)."""
    margin = st.config.bottleneck_margin
    best: StageSample | None = None
    for s in latest.stages:
        if not s.tunable:
            continue
        score = s.in_occupancy - s.out_occupancy
        if score >= margin and (best is None or score > best.in_occupancy - best.out_occupancy):
            best = s
    return best


def _propose_trim(st: TunerState, latest: AutotuneSample) -> tuple[str, int, int] | None:
    """Nothing left to grow: try a quarter less of the tunable stage that waits most on
    its input. On a busy machine surplus workers cost CPU that the bottleneck could use;
    the trim is kept only if throughput rises, like any other trial. The bottleneck
    itself is not trimmed: fewer of it can only deliver less, and the trial would cost a
    window of lower throughput for nothing. Nor is a stage whose fewer workers could
    not keep up with the rate it runs at, by Little's law at the least wall time per
    item seen (the queues' occupancy tells a bottleneck only roughly: a decode stage
    whose input queue was half full was trimmed from 2 workers to 1, for a window at
    -45%)."""
    margin = st.config.bottleneck_margin
    costs = {c.name: c for c in st.costs(st.last)[0]} if st.last else {}

    def keeps_up(name: str, n: int) -> bool:
        c = costs.get(name)
        wall = c.least_wall or c.wall if c is not None else None
        return c is None or not wall or c.rate <= 0 or n / wall >= c.rate

    stages = []
    for s in latest.stages:
        cur = st.conc.get(s.name, s.concurrency)
        if (
            s.tunable
            and s.name not in st.trimmed
            and cur > s.min_concurrency
            and s.in_occupancy - s.out_occupancy < margin  # not the bottleneck
            and keeps_up(s.name, _quarter_fewer(cur, s.min_concurrency))
        ):
            stages.append(s)
    if not stages:
        return None
    s = min(stages, key=lambda s: s.in_occupancy)
    st.trimmed.add(s.name)
    cur = st.conc.get(s.name, s.concurrency)
    return s.name, cur, _quarter_fewer(cur, s.min_concurrency)


def _climb_cap(st: TunerState, name: str) -> int | None:
    """The most workers the climb tries for stage ``name``: :data:`_CLIMB_OVER_CORES`
    times what uses the CPU budget at the CPU share measured (None: not measured)."""
    c = st.last_cost(name)
    budget = st.config.cpu_budget * st.cores
    cap = None if c is None else cores_cap(c, budget, cores=st.cores)
    return None if cap is None else _CLIMB_OVER_CORES * cap


def _quarter_fewer(n: int, floor: int) -> int:
    """A quarter fewer than ``n`` workers (at least one fewer), never below ``floor``."""
    return max(floor, n - max(1, n // 4))
