"""The tuner's first step: the concurrency each stage needs, from what its items cost.

Hill-climbing from one worker needs a trial per doubling (several seconds to reach 64), so
a short epoch ends before it gets there. Instead, the first items through each stage are
measured (wall and CPU seconds per item, items per second) and Little's law gives the
answer at once: to sustain a rate ``L`` a stage whose item takes ``w`` seconds needs
``L * w`` items in flight. The rate aimed for is the least of:

- what the CPU budget pays for: each item delivered costs the CPU of every stage it went
  through: its measured op CPU, plus the engine's work per stage (taken as
  :data:`HOP_CPU_S` at start-up; after that, measured: the process's CPU beyond the ops,
  per item);
- what the stages with a fixed concurrency can do (``n / w`` each): the downstream (or
  upstream) demand the autotuned stages cannot change;
- the current rate, when the consumer is the limit already (the sink is full).

A stage that burns CPU goes to about the cores the budget allows (``n * cpu / w`` cores). A
stage that only waits (its op on the CPU less than :data:`WAITS` of its wall time, and using
little of the budget in all: :data:`WAITING_CORES`) is sized for what the rest can take
(Little's law with the others' new rate, a quarter to spare), or, when nothing else limits
it, for what the CPU budget pays for, up to its bound. Its few microseconds per item matter
only at tens of thousands of items a second (256 coroutines sleeping 5 ms: 50,000/s), and
there they are the limit. At start-up its op CPU is not trusted (an op's first calls run
cold, at several times their steady cost) and only the engine's hop is priced, so it
usually goes straight to its bound; from the first full window on, items are priced at
what the process measurably spent on them, and the controller judges every step, scaling
it back by the excess if the process goes over the budget.
Rates are compared in the units of the first measured stage, so ``aggregate`` in between
(a batch per 32 items) is accounted for. Pure functions: no clock, no thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "HOP_CPU_S",
    "WAITS",
    "StageCost",
    "Target",
    "cores_cap",
    "early_target",
    "model_targets",
    "only_waits",
    "process_hop",
]

# The engine's own CPU per item per stage (take, hand off, count), beyond what the op's
# meter sees: on the 2-core development machine a 5 ms sleeping stage uses 16-25 us of
# process CPU per item in all, of which the meter sees 10-25 us at one worker (wake-ups
# that amortise at higher rates). Faster machines spend less.
HOP_CPU_S = 10e-6
# The sink is this full (or fuller): the consumer sets the pace, nothing to gain.
_CONSUMER_BOUND = 0.9
# A stage whose op spends less than this share of its wall time on the CPU only waits...
WAITS = 0.1
# ... unless it uses this share of the CPU budget all the same: then its threads wait for
# cores, not for I/O (on a machine busy with other work, a CPU-bound op runs a fraction of
# its wall time), and more of them would only wait longer.
WAITING_CORES = 0.25


class Target(NamedTuple):
    """The model's answer for one stage."""

    concurrency: int
    reason: str


@dataclass(frozen=True)
class StageCost:
    """One stage over the measured window."""

    name: str
    tunable: bool
    concurrency: int
    bound: int  # the most it may run (its concurrency when fixed)
    rate: float  # items finished per second
    wall: float | None  # seconds per item inside the op (None: no item finished)
    cpu: float | None  # CPU seconds per item inside the op (None: not measured)
    least_wall: float | None = None  # the least wall per item seen so far (least contended)


def model_targets(
    costs: Sequence[StageCost],
    *,
    cpu_used: float,
    budget: float,
    sink_occupancy: float = 0.0,
    hop_cpu: float = HOP_CPU_S,
    price_process: bool = True,
    cheapest_hop: float = math.inf,
    cores: float | None = None,
) -> dict[str, Target]:
    """``{stage: target}`` for the tunable stages the model can size.

    Args:
        costs: every stage of the pipeline in order, tunable or not.
        cpu_used: the process's CPU over the window, in cores (seconds per second).
        budget: the CPU budget in cores.
        sink_occupancy: how full the sink was (0-1).
        price_process: price the CPU the process used beyond the ops per item (at
            least ``hop_cpu`` per stage); False at start-up, when that CPU is the pipeline
            starting, and ``hop_cpu`` alone is used.
        cheapest_hop: the least that CPU per item was measured at in earlier windows
            (:func:`process_hop`); the price is never above it.
        cores: the cores the process may use (None: not known), for :func:`cores_cap`.
    """
    known = [c for c in costs if c.rate > 0 and c.wall]
    if not known:
        return {}
    ref = known[0].rate
    flow = {c.name: c.rate / ref for c in known}  # stage items per reference item
    if price_process:
        # The process's CPU beyond what the ops used is priced per item too (spread over
        # the stages' items), never below the engine's own cost: at tens of thousands of
        # items a second the engine's hops and the op's wake-ups are most of it. The CPU
        # outside the pipeline (a training loop) is priced per item too, which errs
        # towards staying within the budget. The price is the least measured so far: the
        # engine's cost per item falls as the rate rises (wake-ups amortise), while a
        # window whose throughput collapsed (the storage got slower) spreads the
        # process's fixed costs over few items and would price them several times too
        # high, sizing every stage too small to recover.
        measured = process_hop(known, cpu_used)
        hop_cpu = max(hop_cpu, min(measured, cheapest_hop))
    affordable = _affordable_rate(known, flow, hop_cpu, budget, start=not price_process)
    demand = _fixed_demand(known, flow, sink_occupancy)
    out: dict[str, Target] = {}
    waiting: list[StageCost] = []
    for c in known:
        if not c.tunable:
            continue
        if only_waits(c, budget, start=not price_process):
            waiting.append(c)
            continue
        out[c.name] = _burning_target(
            c, flow[c.name], affordable, demand, budget=budget, cores=cores
        )
    # A stage that only waits costs (almost) no CPU: it is sized for what the rest of the
    # pipeline can take, with a quarter to spare, or goes to its bound when nothing limits.
    for c in known:
        if c.name in out:  # a stage that burns CPU, at its new concurrency
            n = out[c.name].concurrency
            can = n / (c.wall * flow[c.name])  # type: ignore[operator]
            if can < demand[0]:
                demand = can, f"stage {c.name} at {n} does {can:,.0f}/s"
    for c in waiting:
        out[c.name] = _waiting_target(c, flow[c.name], affordable, demand)
    return out


def _affordable_rate(
    known: Sequence[StageCost],
    flow: dict[str, float],
    hop_cpu: float,
    budget: float,
    *,
    start: bool,
) -> float:
    """The rate (in reference items per second) the CPU budget pays for, at ``hop_cpu``
    per stage and item beyond each op's own CPU."""
    # At start-up the op CPU of a stage that only waits is not trusted: its first calls run
    # cold, at several times their steady cost (a coroutine sleeping 5 ms: 20 us a call,
    # then 4), and that is all it costs; priced so, it would be sized at half of what the
    # budget pays for. Its engine hop is counted; the first full window measures the rest.
    cold = {c.name for c in known if start and only_waits(c, budget, start=True)}
    per_item = sum(
        flow[c.name] * (hop_cpu + (0.0 if c.name in cold else c.cpu or 0.0)) for c in known
    )
    return budget / per_item if per_item > 0 else math.inf


def _fixed_demand(
    known: Sequence[StageCost], flow: dict[str, float], sink_occupancy: float
) -> tuple[float, str]:
    """What the autotuned stages cannot change: the least rate of the fixed stages and of
    the consumer (when the sink is full), and why (``inf``: nothing limits)."""
    ref = known[0].rate
    demand, demand_why = math.inf, ""
    for c in known:
        if not c.tunable:
            can = c.concurrency / (c.wall * flow[c.name])  # type: ignore[operator]
            if can < demand:
                demand, demand_why = can, f"fixed stage {c.name} does {can:,.0f}/s"
    if sink_occupancy >= _CONSUMER_BOUND and ref < demand:
        demand, demand_why = ref, f"the consumer takes {ref:,.0f}/s"
    return demand, demand_why


def _burning_target(
    c: StageCost,
    flow: float,
    affordable: float,
    demand: tuple[float, str],
    *,
    budget: float,
    cores: float | None,
) -> Target:
    """A stage that burns CPU: Little's law at the least of what the budget pays for
    and the demand, within the workers that use the budget (:func:`cores_cap`)."""
    assert c.wall is not None
    share = None if c.cpu is None else c.cpu / c.wall
    target, why = affordable, f"the CPU budget pays for {affordable:,.0f}/s"
    by_budget = demand[0] >= target  # the budget, not the rest of the pipeline, limits
    if not by_budget:
        target, why = demand
    n = math.ceil(flow * target * c.wall - 1e-9)  # Little's law
    reason = f"{c.wall * 1e3:.2f} ms/item"
    if share is not None and share > 0:
        reason += f", {share:.0%} on the CPU"
        cap = cores_cap(c, budget, cores=cores)
        if cap is not None and cap < n:
            n, why = cap, f"{cap} workers use the CPU budget ({budget:.2f} cores)"
        elif cap is not None and n < cap and by_budget and _every_core(budget, cores):
            # The budget is every core, which the process cannot go over: a worker more
            # keeps the cores busy while the others are between items (:func:`cores_cap`;
            # Little's law at 100% on the CPU asks for just the cores).
            n += 1
            why += ", a worker more to keep every core busy"
    n = max(1, min(n, c.bound))
    return Target(n, f"{reason}; {why}; Little's law: {n}")


def _waiting_target(
    c: StageCost, flow: float, affordable: float, demand: tuple[float, str]
) -> Target:
    """A stage that only waits: Little's law at what the rest can take, a quarter to
    spare, or at what the budget pays for (up to its bound) when nothing else limits."""
    assert c.wall is not None and c.cpu is not None
    reason = f"{c.wall * 1e3:.2f} ms/item, {c.cpu / c.wall:.0%} on the CPU: it waits"
    # Little's law at what the budget pays for: a stage that waits costs little CPU per
    # item, but the engine's hops and the op's own wake-ups add up at tens of
    # thousands of items a second (256 coroutines sleeping 5 ms: 50,000/s).
    paid = math.inf if math.isinf(affordable) else flow * affordable * c.wall
    if math.isinf(demand[0]):
        if paid >= c.bound:
            return Target(c.bound, f"{reason}; nothing else limits: its bound {c.bound}")
        n = max(1, math.floor(paid))
        why = f"the CPU budget pays for {affordable:,.0f}/s"
        return Target(n, f"{reason}; {why}; Little's law: {n}")
    rate, why = demand
    if affordable < rate:
        rate, why = affordable, f"the CPU budget pays for {affordable:,.0f}/s"
    n = max(1, min(c.bound, math.ceil(1.25 * flow * rate * c.wall)))
    return Target(n, f"{reason}; {why}; Little's law with 25% spare: {n}")


def early_target(
    *,
    pending: int,
    age: float,
    cpu: float | None,
    bound: int,
    budget: float,
    stages: int,
    hop_cpu: float = HOP_CPU_S,
) -> Target | None:
    """The least an async stage none of whose items has finished yet needs, or None when
    what it shows so far is not waiting.

    ``pending`` of its items are in flight, the first of them for ``age`` seconds, none
    finished, using ``cpu`` seconds of the loop each between their await points: at a small
    share of that time (:data:`WAITS`) they wait, and Little's law holds for the wall time
    they will take, which is at least ``age``. Seen at a moment that bears no relation to
    when it will finish, an item is as likely to be before as after halfway, so the wall is
    taken as twice the age (a guess that overshoots the need by at most that factor, whatever
    the scale of the wait; the first items to finish correct it). The rate aimed for is what the
    CPU budget pays for at the engine's hop on each of the pipeline's ``stages`` (their own
    costs are not known yet), as for a stage that waits at start-up in
    :func:`model_targets`: the answer is at most twice that one's once the items finish.
    """
    if pending <= 0 or age <= 0 or cpu is None or cpu >= WAITS * age:
        return None
    rate = budget / (hop_cpu * max(1, stages))
    n = max(1, min(bound, math.floor(rate * 2 * age)))
    return Target(
        n,
        f"{pending} items in flight, the first for {age * 1e3:.1f} ms, {cpu / age:.0%} on the "
        f"CPU: they wait; the CPU budget pays for {rate:,.0f}/s; Little's law at twice their "
        f"age: {n}",
    )


def cores_cap(c: StageCost, budget: float, *, cores: float | None = None) -> int | None:
    """How many workers of stage ``c`` use ``budget`` cores, from the share of its wall time
    its op is on the CPU (None when that is not measured). The share is the one seen least
    contended: threads that wait for a core look less busy, and more of them would only
    wait longer.

    Rounded down, so as not to go over the budget; but one worker more when the budget is
    all the ``cores`` there are, which the process cannot go over: it makes up for the
    time each spends off the CPU between items (PIL decode on 2 cores, 97% on the CPU: 2
    workers by the share, and 3 ran 9% faster, in the median of six interleaved sets). A
    share read at 100% (a first item's wall and CPU times agree within the clocks'
    granularity) is no exception: 3 workers, not 2."""
    if c.cpu is None or not c.wall or c.cpu <= 0:
        return None
    share = c.cpu / c.wall
    # A thread uses at most one core: a share above 1 is the clocks' granularity, and would
    # cost a worker (budget 2 cores / 1.02 = 1).
    top = min(1.0, max(share, c.cpu / c.least_wall if c.least_wall else share))
    if _every_core(budget, cores):
        return math.floor(budget / top + 1e-9) + 1
    return max(1, math.floor(budget / top + 1e-9))


def _every_core(budget: float, cores: float | None) -> bool:
    """Whether the CPU budget (in cores) is every core the process may use."""
    return cores is not None and budget >= cores


def process_hop(costs: Sequence[StageCost], cpu_used: float) -> float:
    """The process's CPU beyond what the ops used, per stage item, over a window (``inf``
    when no item went through)."""
    known = [c for c in costs if c.rate > 0 and c.wall]
    hops = sum(c.rate for c in known)
    if not hops:
        return math.inf
    in_ops = sum(c.rate * (c.cpu or 0.0) for c in known)
    return max(0.0, cpu_used - in_ops) / hops


def only_waits(c: StageCost, budget: float, *, start: bool = False) -> bool:
    """Whether the stage only waits: its op is on the CPU for less than :data:`WAITS` of
    its wall time, and its CPU in all is a small part of the budget. At ``start`` the
    second test is not made: over the first items neither their CPU (cold) nor their rate
    (the first ones finishing together) is what they cost once running, and an async stage
    grown early to 256 coroutines finished its first 120 at once, read 0.2 cores of cold
    CPU, and was sized at 223 for the CPU it would not use. (Threads waiting for cores
    look idle only when they far outnumber the cores, which a stage does not at start.)"""
    if c.cpu is None or not c.wall:
        return False
    if c.cpu / c.wall >= WAITS:
        return False
    return start or c.rate * c.cpu < WAITING_CORES * budget
