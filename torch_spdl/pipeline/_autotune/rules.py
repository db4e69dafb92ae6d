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

This module is the state machine's face and its one dispatch: it gathers each tick into
a window and hands the window to the phase whose turn it is. The rules themselves live
one phase to a module, all reading and writing one :class:`TunerState`
(``tuning_state.py``), so that each rule can read what the others left without the state
being passed back and forth: ``phase_model.py`` (the model's step and its looks again),
``phase_climb.py`` (the next trial), ``judge.py`` (keep, scale back or revert a trial),
``budget.py`` (shrink and scale back, for every phase), ``phase_hold.py`` (hold and
watch). Their imports run in that order, from the state up, and none back.
"""

from __future__ import annotations

from .judge import judge
from .phase_climb import decide
from .phase_hold import watch
from .phase_model import look, model_step
from .probes import cpu_count
from .tuning_state import Phase, TunerState
from .vocabulary import AutotuneConfig, AutotuneSample, Decision

__all__ = ["AutotuneController"]


class AutotuneController:
    """Decides concurrency changes from samples; holds no thread and reads no clock.

    Phases: ``model`` (the first ticks: measure what items cost), ``look`` (a few short
    ticks after the model's step: measure again), ``baseline`` (measure the current
    configuration), ``trial`` (stages were resized; keep or revert), ``steady``
    (nothing to try; watch for a workload change or for going over budget). ``cores`` is
    what ``cpu`` fractions are of (default: the cores this process may use).
    """

    def __init__(self, config: AutotuneConfig | None = None, *, cores: int | None = None) -> None:
        config = config or AutotuneConfig()
        self._st = TunerState(
            config,
            cores or cpu_count(),
            phase="model" if config.model else "baseline",
            skip=0 if config.model else config.settle_ticks,
        )

    @property
    def config(self) -> AutotuneConfig:
        return self._st.config

    @property
    def cores(self) -> int:
        return self._st.cores

    @property
    def phase(self) -> Phase:
        """The phase the next tick is taken in."""
        return self._st.phase

    @property
    def decisions(self) -> list[str]:
        """What was decided and why, as text."""
        return self._st.decisions

    @property
    def events(self) -> list[Decision]:
        """The same decisions, structured (for the trace)."""
        return self._st.events

    @property
    def baseline(self) -> float:
        """The throughput of the configuration currently held."""
        return self._st.base

    @property
    def interval(self) -> float:
        """How long the next tick should be: short while the model measures, and while
        its step is checked against the budgets (the check needs no throughput to beat, so
        a few short ticks tell; a step over the CPU budget is scaled back within 0.1 s)."""
        st = self._st
        if st.phase == "model":
            return st.config.model_interval
        if st.phase == "look" or (st.phase == "trial" and st.unjudged):
            return st.config.check_interval
        return st.config.interval

    def held(self) -> dict[str, int]:
        """The configuration to remember: a one-stage trial counts as not taken."""
        st = self._st
        conf = dict(st.conc)
        if not st.jump:
            conf.update({name: old for name, (old, _) in st.trial.items()})
        return conf

    def step(self, sample: AutotuneSample) -> dict[str, int]:
        """Take one tick's sample; return ``{stage name: new concurrency}`` to apply."""
        st = self._st
        for s in sample.stages:
            st.conc.setdefault(s.name, s.concurrency)
            st.floor[s.name] = s.min_concurrency
        if st.phase == "model":
            changes = model_step(st, sample)
            if st.phase == "model" or changes:
                return changes
            st.skip = st.config.settle_ticks  # no model: climb, as before
        if st.skip > 0:
            st.skip -= 1
            return {}
        window = self._full_window(sample)
        return {} if window is None else self._decide_on(window)

    def _full_window(self, sample: AutotuneSample) -> list[AutotuneSample] | None:
        """Add ``sample`` to the window; the window once it has the phase's ticks."""
        st = self._st
        st.window.append(sample)
        checking = st.phase == "trial" and st.unjudged
        needed = st.config.check_ticks if checking else st.config.measure_ticks
        if st.phase == "look":
            needed = st.config.look_ticks
        if len(st.window) < needed:
            return None
        window, st.window = st.window, []
        st.last = window
        return window

    def _decide_on(self, window: list[AutotuneSample]) -> dict[str, int]:
        """Hand a full window to the phase whose turn it is."""
        st = self._st
        tput = sum(s.throughput for s in window) / len(window)
        cpu = sum(s.cpu for s in window) / len(window)
        rss = max((s.rss for s in window if s.rss is not None), default=None)
        latest = window[-1]
        if st.phase == "trial":
            return judge(st, tput, cpu, rss, latest)
        if st.phase == "look":
            return look(st, cpu, rss)
        if st.phase == "steady":
            return watch(st, tput, cpu, rss, latest)
        st.base = tput
        return decide(st, cpu, rss, latest)
