"""The end of every trial: keep it, scale it back, or revert it.

Every change the autotuner makes (the model's step, a look again, a climb's try) is a
trial, judged here on the window measured after it, so that one rule says what "better"
means for all of them. A climb's trial is kept when delivered throughput rises by more
than ``min_gain`` within the budgets; a model step is kept unless it breaks a budget
(its base was a few short ticks, noise rather than a rate to beat), and over the CPU
budget it is scaled back (``budget.py``) rather than reverted. What a revert teaches is
kept as a ceiling, so the climb never tries the same thing twice. After a kept or
reverted trial the climb decides the next (``phase_climb.py``).

These rules read and write the shared :class:`TunerState`. Pure: no clock, no thread.
"""

from __future__ import annotations

from .budget import scale_back, trims
from .phase_climb import decide
from .tuning_state import TunerState
from .vocabulary import AutotuneSample

__all__ = ["judge"]


def judge(
    st: TunerState, tput: float, cpu: float, rss: int | None, latest: AutotuneSample
) -> dict[str, int]:
    """The trial under way, measured over a window: keep, scale back or revert it."""
    trial, jump, unjudged = st.trial, st.jump, st.unjudged
    st.trial, st.jump, st.unjudged = {}, False, False
    gain = (tput - st.base) / st.base if st.base > 0 else (1.0 if tput > 0 else 0.0)
    within = cpu <= st.config.cpu_budget and not st.over_memory(rss)
    if jump and not st.over_memory(rss):
        if st.over(cpu, rss):
            return scale_back(st, trial, tput, cpu, recheck=unjudged)
        if cpu > st.config.cpu_budget and trims(st, trial, cpu):
            # Within the band but over the budget: the model's step aims at the budget,
            # and the band is for what is held (a window's noise must not shrink a
            # setting that was right), not room to step into. Kept at the band's edge,
            # a short run ends over it once the start-up's CPU is added.
            return scale_back(st, trial, tput, cpu, recheck=unjudged, fine=True)
        within = True
        if unjudged:  # its base was a few short ticks: noise, not a rate to beat
            gain = max(gain, st.config.min_gain * 2)
    if gain > st.config.min_gain and within:
        _keep(st, trial, jump=jump, unjudged=unjudged, tput=tput, gain=gain)
        if unjudged:
            # A few short ticks catch a step that is over the budget at once, not one
            # that drifts over it as the pipeline settles (on 2 cores, threads sharing
            # one core hand the GIL over cheaply until the scheduler moves one to the
            # other core, and the CPU per item doubles). So the next full window is the
            # step's baseline and its second judgment: over the budget there, it is
            # scaled down at once, not after two held windows.
            return {}
        return decide(st, cpu, rss, latest)
    why = _why_not(st, gain, cpu, rss, within=within)
    revert = _revert(st, trial, jump=jump, within=within, why=why)
    if not within:
        return revert
    following = decide(st, cpu, rss, latest)  # the next bottleneck, or hold
    return {**revert, **following}


def _keep(
    st: TunerState,
    trial: dict[str, tuple[int, int]],
    *,
    jump: bool,
    unjudged: bool,
    tput: float,
    gain: float,
) -> None:
    """Keep ``trial``: its throughput is the new base, and a stage it brought down may
    not grow back past where it was (growing back is known to be worse)."""
    what = "the model's step" if jump else ", ".join(f"{k}={n}" for k, (_, n) in trial.items())
    if unjudged:
        st.note(f"keep {what}: {tput:.1f}/s within the budgets")
    else:
        st.note(f"keep {what}: {st.base:.1f} -> {tput:.1f}/s ({gain:+.0%})")
    st.base = tput
    for name, (old, new) in trial.items():
        if new < old:  # growing back is known to be worse: the stage's ceiling now
            st.ceiling[name] = old
        elif not jump:
            st.undo.append((name, old))
            st.ceiling = {k: v for k, v in st.ceiling.items() if k == name}
    st.trimmed.clear()
    st.phase = "baseline"
    if unjudged and st.look_due:
        st.look_due, st.phase = False, "look"


def _why_not(st: TunerState, gain: float, cpu: float, rss: int | None, *, within: bool) -> str:
    """Why a trial is reverted, in words."""
    if within:
        return f"gain {gain:+.0%}"
    if st.over_memory(rss):
        return f"over the memory limit (RSS {rss} bytes)"
    return f"over budget (CPU {cpu:.0%})"


def _revert(
    st: TunerState, trial: dict[str, tuple[int, int]], *, jump: bool, within: bool, why: str
) -> dict[str, int]:
    """Put every stage of ``trial`` back, remembering above what it did not help
    (``within``: it stayed within the budgets, and gained too little)."""
    revert: dict[str, int] = {}
    for name, (old, new) in trial.items():
        st.note(f"revert {name} to {old}: {why}", name, old)
        if jump:  # the model was wrong about this stage: the climb takes it from here
            st.unmodelled.add(name)
        # Over budget: the limit lies between old and new, so bisect towards it later. No
        # gain from old to new: throughput is concave in concurrency, so nothing in
        # between gains either; the stage is saturated at old (no bisection trials).
        if new > old:
            limit = new if not within else old + 1
            st.ceiling[name] = min(limit, st.ceiling.get(name, limit))
        revert[name] = old
    st.apply(revert)
    st.phase = "baseline"
    return revert
