"""The autotuner's way down: what it does when the process goes over a budget.

Two rules, used by every phase that can find the process over the CPU budget or memory
limit, so they sit below them all: a model step over the CPU budget is scaled back to
what the budget pays for (:func:`scale_back`, from ``judge.py``), and a held or climbing
configuration over a budget is shrunk (:func:`shrink`, from ``phase_climb.py`` and
``phase_hold.py``). Both leave a ceiling above the stage they bring down, so the climb
does not spend a window going back to where it was over. Pure: no clock, no thread.
"""

from __future__ import annotations

import math

from .tuning_state import TunerState
from .vocabulary import AutotuneSample, StageSample

__all__ = ["scale_back", "shrink", "trims"]


def trims(st: TunerState, trial: dict[str, tuple[int, int]], cpu: float) -> bool:
    """Whether a ``fine`` scale-back (:func:`scale_back`) changes any stage."""
    ratio = st.config.cpu_budget / cpu
    return any(old < new and _cut_by(new, ratio) < new for old, new in trial.values())


def scale_back(
    st: TunerState,
    trial: dict[str, tuple[int, int]],
    tput: float,
    cpu: float,
    *,
    recheck: bool,
    fine: bool = False,
) -> dict[str, int]:
    """The model's step went over the CPU budget: bring the grown stages down to what
    the budget pays for (:meth:`TunerState.affordable`), keep the rest. ``fine`` (the step
    is within the tolerance band): trim them by the excess alone, rounded up, so a stage
    of a few workers loses none for an excess smaller than one of them, and with no
    Little's law on the rate of short ticks, which is still the start-up's.

    With ``recheck`` (the step was judged on short ticks), the scaled-back step is
    judged again the same way: the CPU per item is not proportional everywhere (on 2
    cores it about doubles once the load spreads the pipeline's threads over both
    cores), and a scale-back that is still over the budget is scaled back again within
    a tenth of a second, not after a full window."""
    ratio = st.config.cpu_budget / cpu
    changes: dict[str, int] = {}
    for name, (old, new) in trial.items():
        if new <= old:
            continue
        if fine:
            n = max(old, _cut_by(new, ratio))
        else:
            n = max(old, min(new - 1, st.affordable(name, new, ratio)))
        st.ceiling[name] = min(new, st.ceiling.get(name, new), _above(n))
        st.unmodelled.add(name)
        st.cpu_bound.add(name)
        if n != new:
            changes[name] = n
            st.note(
                f"scale {name} back: {new} -> {n} "
                f"(CPU {cpu:.0%}, over the budget of {st.config.cpu_budget:.0%})",
                name,
                n,
            )
    st.base = tput * ratio
    st.phase = "baseline"
    if changes and recheck:
        st.trial = {name: (trial[name][0], n) for name, n in changes.items()}
        st.jump = st.unjudged = True
        st.phase = "trial"
    return st.apply(changes)


def shrink(st: TunerState, cpu: float, rss: int | None, latest: AutotuneSample) -> dict[str, int]:
    """Over the CPU budget or memory limit: undo the newest kept growth; without one,
    shrink the stage that uses the most CPU, by the excess."""
    memory = st.over_memory(rss)
    what = f"CPU {cpu:.0%}" if not memory else f"RSS {rss} bytes"
    if st.undo:
        name, prev = st.undo.pop()
    else:
        heaviest = _heaviest(st, latest)
        if heaviest is None:
            st.note(f"over budget ({what}) with every tunable stage at its least: hold")
            return st.hold()
        name, prev = heaviest.name, _fewer(st, heaviest, cpu, memory)
        st.unmodelled.add(name)  # the model sized it over the budget: climb only
    cur = st.conc.get(name, prev)
    st.ceiling[name] = min(cur, st.ceiling.get(name, cur), _above(prev))
    st.note(f"shrink {name}: {cur} -> {prev} (over budget: {what})", name, prev)
    st.phase = "baseline"
    return st.apply({name: prev})


def _heaviest(st: TunerState, latest: AutotuneSample) -> StageSample | None:
    """The tunable stage above its floor whose items used the most CPU (None: none)."""
    tunable = [s for s in latest.stages if s.tunable and st.conc.get(s.name, 1) > s.min_concurrency]
    if not tunable:
        return None

    def load(s: StageSample) -> tuple[float, int]:
        per_item = s.cpu_busy / s.costed if s.cpu_busy is not None and s.costed else 0.0
        return per_item * s.items, st.conc.get(s.name, s.concurrency)

    return max(tunable, key=load)


def _fewer(st: TunerState, top: StageSample, cpu: float, memory: bool) -> int:
    """What stage ``top`` shrinks to: half over the memory limit, what the CPU budget
    pays for over it, at least one fewer, never below its floor."""
    cur = st.conc.get(top.name, top.concurrency)
    if memory or cpu <= 0:
        fewer = cur // 2
    else:
        fewer = st.affordable(top.name, cur, st.config.cpu_budget / cpu)
        st.cpu_bound.add(top.name)
    return max(top.min_concurrency, 1, min(cur - 1, fewer))


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
