"""The autotuner's first phase: the model's step, and the model looked at again.

Hill-climbing from the starting concurrency takes a trial per doubling, so a short epoch
ends before it gets anywhere. Instead, over the first ticks (short ones) the first items
through each stage are measured, and Little's law (``model.py``) sizes every autotuned
stage at once, as one trial (:func:`model_step`). Before any item has finished, an async
stage whose items wait is grown already (:func:`early_step`). Once the step is kept, the
model looks again at the new concurrency, over a few more short ticks (:func:`look`), and
the climb asks it again after each full window (:func:`model_growth`), so what the first
cold items under-sized is grown without a trial per doubling.

The step is judged like any trial (``judge.py``). These rules only propose; they read and
write the shared :class:`TunerState`. Pure: no clock, no thread.
"""

from __future__ import annotations

from .model import early_target, model_targets, only_waits, process_hop
from .tuning_state import TunerState
from .vocabulary import AutotuneSample

__all__ = ["look", "model_growth", "model_step"]


def model_step(st: TunerState, sample: AutotuneSample) -> dict[str, int]:
    """One tick of the model phase: gather the first items' costs, then take the step."""
    tunable = [s for s in sample.stages if s.tunable]
    if not any(s.measured for s in tunable):
        st.phase = "baseline"  # nothing measures costs: hill-climb only
        return {}
    st.window.append(sample)
    done: dict[str, int] = {}
    for smp in st.window:
        for s in smp.stages:
            done[s.name] = done.get(s.name, 0) + s.costed
    ready = all(done.get(s.name, 0) >= st.config.model_items for s in tunable if s.measured)
    if not ready and len(st.window) < st.config.model_ticks:
        return _early_step(st, sample)
    window, st.window = st.window, []
    if st.model_why == "first items":
        st.base = sum(s.throughput for s in window) / len(window)
    changes = _jump_to_model(st, window, st.model_why)
    st.unjudged = st.phase == "trial"  # short ticks measure costs well, throughput not
    st.look_due = True
    if st.phase == "baseline":  # nothing to judge: look again at once
        st.look_due, st.phase = False, "look"
    return changes


def _early_step(st: TunerState, sample: AutotuneSample) -> dict[str, int]:
    """Before any of its items has finished, grow an async stage whose items in flight
    wait (:func:`early_target`): the model's step comes once they finish, a whole wait
    later, and a short epoch has lost that wait at the starting concurrency. Taken
    again each tick as the items age (when it asks for ``remodel_factor`` times more,
    or the bound); the model's step is then judged with what these steps did. None
    over the memory limit: items in flight hold memory before they cost CPU."""
    changes: dict[str, int] = {}
    if st.over_memory(sample.rss):
        return changes
    for i, s in enumerate(sample.stages):
        if not s.tunable or not s.pending:  # (pending: none of its items finished yet)
            continue
        cpus = [w.stages[i].cpu_busy for w in st.window]
        if any(c is None for c in cpus):
            continue
        target = early_target(
            pending=s.pending,
            age=s.pending_age,
            cpu=sum(cpus) / s.pending,  # type: ignore[arg-type]
            bound=s.max_concurrency,
            budget=st.config.cpu_budget * st.cores,
            stages=len(sample.stages),
        )
        if target is None:
            continue
        old = st.conc.get(s.name, s.concurrency)
        n = max(target.concurrency, st.floor.get(s.name, 1))
        if n <= old or (n < st.config.remodel_factor * old and n < s.max_concurrency):
            continue
        changes[s.name] = n
        st.grow_trial(s.name, old, n)
        st.note(f"early {s.name}: {old} -> {n} ({target.reason})", s.name, n)
    return st.apply(changes) if changes else {}


def _model_changes(
    st: TunerState, window: list[AutotuneSample], *, start: bool = False, remember: bool = True
) -> dict[str, tuple[int, str]]:
    """The model's ``{stage: (concurrency, why)}`` over ``window``, within each stage's
    floor and below what is known not to help."""
    costs, cpu_cores = st.costs(window)
    if not start and remember:
        st.cheapest_hop = min(st.cheapest_hop, process_hop(costs, cpu_cores))
    # A full sink says the consumer sets the pace, but not over the first items: a
    # stage started at 256 coroutines (where the last build left it) finishes its first
    # 256 items at once, fills the sink, and its rate over the first few ms is mostly
    # the wait for them (3,000/s): sized for that "consumer", it went 256 -> 23.
    full = window[-1].stages[-1].out_occupancy if window[-1].stages and not start else 0.0
    targets = model_targets(
        costs,
        cpu_used=cpu_cores,
        budget=st.config.cpu_budget * st.cores,
        sink_occupancy=full,
        price_process=not start,
        cheapest_hop=st.cheapest_hop,
        cores=st.cores,
    )
    out = {}
    for name, (n, why) in targets.items():
        if name in st.ceiling:
            n = min(n, st.ceiling[name] - 1)
        out[name] = (max(n, st.floor.get(name, 1)), why)
    return out


def _jump_to_model(st: TunerState, window: list[AutotuneSample], why: str) -> dict[str, int]:
    """Size every measured autotuned stage by the model, as one trial (the phase is
    ``trial`` after it when a stage was resized, ``baseline`` when none was)."""
    st.phase = "baseline"
    if st.over_memory(max((s.rss for s in window if s.rss is not None), default=None)):
        st.note(f"model ({why}): over the memory limit, no jump")
        return {}
    changes: dict[str, int] = {}
    start = why == "first items"
    for name, (n, reason) in _model_changes(st, window, start=start).items():
        old = st.conc.get(name, 1)
        n = max(1, n)
        if n == old:
            continue
        changes[name] = n
        st.grow_trial(name, old, n)  # judged with the early steps, if any
        st.note(f"model {name}: {old} -> {n} ({why}: {reason})", name, n)
    if not st.trial:
        st.note(f"model ({why}): the concurrency held is right")
        return {}
    if not changes:
        st.note(f"model ({why}): the early steps were right")
    st.jump = True
    st.phase = "trial"
    return st.apply(changes)


def look(st: TunerState, cpu: float, rss: int | None) -> dict[str, int]:
    """The model's step was kept: the model again, on the few short ticks just measured
    at the new concurrency, growing a stage that waits when it now asks
    ``remodel_factor`` times more of it (:func:`model_growth`), judged on short ticks
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
    st.phase = "baseline"
    if st.over(cpu, rss) or cpu >= st.config.cpu_budget or not st.last:
        return {}
    budget = st.config.cpu_budget * st.cores
    waiting = {c.name for c in st.costs(st.last)[0] if only_waits(c, budget)}
    return model_growth(st, cpu, st.last, only=waiting)


def model_growth(
    st: TunerState, cpu: float, window: list[AutotuneSample], *, only: set[str] | None = None
) -> dict[str, int]:
    """The model again, on ``window`` (costs per item fall as the rate rises: wake-ups
    amortise): a joint trial when it asks for at least ``remodel_factor`` times more
    of some stage. ``only`` (:func:`look`): the stages it may grow, over a window of a
    few short ticks, whose process CPU per item is not remembered as the cheapest hop,
    and whose growth is judged on short ticks.

    A stage brought down for the CPU budget is not modelled again, but it may grow
    back so, judged on short ticks, when the budget now pays for that much more of it
    (:meth:`TunerState.affordable`, within its ceiling): on 2 cores its CPU per item
    halves when the kernel puts the loop's thread and the consumer's back on one core,
    and a trial of the climb, judged on a full window, came after a 30,000-item run
    (0.75 s) was over."""
    factor = st.config.remodel_factor
    changes: dict[str, int] = {}
    looking = only is not None
    why = "look again" if looking else "refine"
    for name, (n, reason) in _model_changes(st, window, remember=not looking).items():
        old = st.conc.get(name, 1)
        if only is not None and (name not in only or name in st.cpu_bound or name in st.unmodelled):
            continue
        if name in st.cpu_bound and cpu > 0:
            paid = st.affordable(name, old, st.config.cpu_budget / cpu)
            if paid < n:
                n, reason = paid, f"the CPU budget pays for {paid} at {cpu:.0%} now"
        elif name in st.unmodelled:
            continue
        if n >= factor * old or (n > old and n - old >= 8 and n >= 1.25 * old):
            changes[name] = n
            st.trial[name] = (old, n)
            st.note(f"model {name}: {old} -> {n} ({why}: {reason})", name, n)
    if changes:
        st.jump = True
        # growing back within the budget, or what the first items under-sized: kept
        # unless it goes over a budget (short ticks)
        st.unjudged = looking or any(name in st.cpu_bound for name in changes)
        st.phase = "trial"
        st.apply(changes)
    return changes
