"""The tuner's first step: the concurrency each stage needs, from what its items cost.

Hill-climbing from one worker needs a trial per doubling (several seconds to reach 64), so
a short epoch ends before it gets there. Instead, the first items through each stage are
measured (wall and CPU seconds per item, items per second) and Little's law gives the
answer at once: to sustain a rate ``L`` a stage whose item takes ``w`` seconds needs
``L * w`` items in flight. The rate aimed for is the least of:

- what the CPU budget pays for: each item delivered costs the CPU of every stage it went
  through (its measured op CPU, plus :data:`HOP_CPU_S` of engine work per stage); CPU the
  process uses outside the stages (the training loop) is taken as fixed;
- what the stages with a fixed concurrency can do (``n / w`` each): the downstream (or
  upstream) demand the autotuned stages cannot change;
- the current rate, when the consumer is the limit already (the sink is full).

So a stage that only waits (``w`` large, CPU tiny) goes straight to its bound, and one that
burns CPU to about the cores the budget allows (``n * cpu / w`` cores). Rates are compared
in the units of the first measured stage, so ``aggregate`` in between (a batch per 32
items) is accounted for. Pure functions: no clock, no thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HOP_CPU_S", "StageCost", "model_targets"]

# The engine's own CPU per item per stage (take, hand off, count), beyond what the op's
# meter sees: on the 2-core development machine a 5 ms sleeping stage uses 16-25 us of
# process CPU per item in all, of which the meter sees 10-25 us at one worker (wake-ups
# that amortise at higher rates). Faster machines spend less.
HOP_CPU_S = 10e-6
# The sink is this full (or fuller): the consumer sets the pace, nothing to gain.
_CONSUMER_BOUND = 0.9


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


def model_targets(
    costs: Sequence[StageCost],
    *,
    cpu_used: float,
    budget: float,
    sink_occupancy: float = 0.0,
    hop_cpu: float = HOP_CPU_S,
) -> dict[str, tuple[int, str]]:
    """``{stage: (concurrency, reason)}`` for the tunable stages the model can size.

    Args:
        costs: every stage of the pipeline in order, tunable or not.
        cpu_used: the process's CPU over the window, in cores (seconds per second).
        budget: the CPU budget in cores.
        sink_occupancy: how full the sink was (0-1).
    """
    known = [c for c in costs if c.rate > 0 and c.wall is not None]
    if not known:
        return {}
    ref = known[0].rate
    flow = {c.name: c.rate / ref for c in known}  # stage items per reference item
    in_stages = sum(c.rate * ((c.cpu or 0.0) + hop_cpu) for c in known)
    outside = max(0.0, cpu_used - in_stages)
    per_item = sum(flow[c.name] * ((c.cpu or 0.0) + hop_cpu) for c in known)
    affordable = max(budget - outside, 0.0) / per_item if per_item > 0 else math.inf
    target, why = affordable, f"the CPU budget pays for {affordable:,.0f}/s"
    for c in known:
        if c.tunable or not c.wall:
            continue
        can = c.concurrency / (c.wall * flow[c.name])
        if can < target:
            target, why = can, f"fixed stage {c.name} does {can:,.0f}/s"
    if sink_occupancy >= _CONSUMER_BOUND and ref < target:
        target, why = ref, f"the consumer takes {ref:,.0f}/s"
    out: dict[str, tuple[int, str]] = {}
    for c in known:
        if not c.tunable:
            continue
        assert c.wall is not None
        need = flow[c.name] * target * c.wall  # Little's law: items in flight
        n = c.bound if math.isinf(need) else math.ceil(need - 1e-9)
        reason = f"{c.wall * 1e3:.2f} ms/item"
        if c.cpu is not None and c.wall > 0:
            reason += f", {c.cpu / c.wall:.0%} on the CPU"
            busy = c.cpu / c.wall  # cores one worker keeps busy
            if busy > 0:
                cap = max(1, math.floor(budget / busy + 1e-9))
                if cap < n:
                    n, why_c = cap, f"{cap} workers use the CPU budget ({budget:.2f} cores)"
                    out[c.name] = (max(1, min(n, c.bound)), f"{reason}; {why_c}")
                    continue
        n = max(1, min(n, c.bound))
        bound = " (its bound)" if n == c.bound else ""
        out[c.name] = (n, f"{reason}; {why}; x {c.wall * 1e3:.2f} ms = {n}{bound}")
    return out
