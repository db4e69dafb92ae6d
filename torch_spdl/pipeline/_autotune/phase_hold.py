"""The autotuner's last phase: hold the configuration, and watch it.

With nothing left to try, the controller holds (the ``steady`` phase) and watches two
things each window: going over a budget, which shrinks a stage (``budget.py``), and a
workload change (throughput moved by more than ``drift``), which forgets what was learnt
and explores again, with the model's step when costs are measured (``phase_model.py``),
else with the climb (``phase_climb.py``).

These rules read and write the shared :class:`TunerState`. Pure: no clock, no thread.
"""

from __future__ import annotations

from .budget import shrink
from .phase_climb import decide
from .tuning_state import TunerState
from .vocabulary import AutotuneSample

__all__ = ["watch"]


def watch(
    st: TunerState, tput: float, cpu: float, rss: int | None, latest: AutotuneSample
) -> dict[str, int]:
    """One full window while holding: shrink, explore again, or go on holding."""
    # Holding: shrink only when two windows in a row are over, so that one noisy CPU
    # reading at the edge of the budget does not cost a worker for good; or one window
    # far over (twice the tolerance: 48% against a 40% budget), which is no edge (on
    # 2 cores, the CPU per item doubles once the threads spread over both cores, and
    # over a run of 0.75 s two windows of it were most of the run).
    far = cpu > st.config.cpu_budget * (1 + 2 * st.config.cpu_tolerance)
    st.over_windows = st.over_windows + 1 if st.over(cpu, rss) else 0
    if st.over_windows >= 2 or far:
        st.over_windows = 0
        return shrink(st, cpu, rss, latest)
    base = st.base
    shift = abs(tput - base) / base if base > 0 else (1.0 if tput > 0 else 0.0)
    st.drifted = st.drifted + 1 if shift > st.config.drift else 0
    if not st.drifted:
        return {}
    modelled = st.config.model and any(s.measured for s in latest.stages if s.tunable)
    if st.drifted < st.config.drift_windows and not modelled:
        return {}
    st.note(f"workload changed: {base:.1f} -> {tput:.1f}/s; explore again")
    _forget(st)
    st.base = tput
    if modelled:
        # Measure the items' costs afresh (short ticks, all after the change: the window
        # just seen may straddle it), then size by the model; a shift that was noise
        # leaves the model where it was, at the cost of a few short ticks.
        st.phase = "model"
        st.model_why = "workload changed"
        return {}
    st.phase = "baseline"
    return decide(st, cpu, rss, latest)


def _forget(st: TunerState) -> None:
    """The workload changed: what was learnt about the old one no longer holds."""
    st.ceiling.clear()
    st.unmodelled.clear()
    st.cpu_bound.clear()
    st.trimmed.clear()
    st.least_wall.clear()
