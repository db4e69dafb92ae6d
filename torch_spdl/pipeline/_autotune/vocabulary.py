"""The autotuner's vocabulary: its knobs (:class:`AutotuneConfig`), the samples it is fed
(:class:`AutotuneSample` of :class:`StageSample`), what it answers (:class:`Decision`),
and the defaults a build needs before any tuning.

Data only, apart from the controller (``rules.py``) and the sampler thread
(``tuner.py``), so that the declaration side (``_declare/config.py``) and the public API can
name them without importing either.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_CPU_BUDGET",
    "DEFAULT_MAX_COROUTINES",
    "DEFAULT_MAX_THREADS",
    "DEFAULT_START",
    "DEFAULT_START_COROUTINES",
    "AutotuneConfig",
    "AutotuneSample",
    "Decision",
    "StageSample",
]

DEFAULT_CPU_BUDGET = 0.4
DEFAULT_MAX_THREADS = 64
DEFAULT_MAX_COROUTINES = 256
# Where an autotuned stage starts: enough workers for the first items (what the model
# measures) to come quickly, few enough to cost nothing for the few ms before the model.
DEFAULT_START = 4
# ... and an async one: a parked coroutine costs no thread, and until the model's step
# (a few ms in) the first ones are all that run. At 40,000 items a second (256 coroutines
# sleeping 5 ms) starting at 16, not 4, has the 1,000th item out 1.5 ms sooner.
DEFAULT_START_COROUTINES = 16


@dataclass(frozen=True)
class AutotuneConfig:
    """The controller's knobs.

    ``cpu_budget``: the most process CPU time per second, as a fraction of the cores this
    process may use (0.4 on 8 cores: 3.2 cores). ``memory_limit``: the most resident memory
    in bytes (None: no bound). A tick is ``interval`` seconds; after each change the first
    ``settle_ticks`` are ignored and the next ``measure_ticks`` averaged. A change is kept
    when throughput rises by more than ``min_gain``; at a held configuration, a shift of
    more than ``drift`` for ``drift_windows`` windows in a row starts a new exploration
    (one window when the model then asks for ``remodel_factor`` times more or less of a
    stage). The process may exceed the CPU budget by ``cpu_tolerance`` (relative) before
    stages are shrunk, a band that keeps grow and shrink decisions apart. A stage is a
    bottleneck when its input queue is fuller than its output queue by
    ``bottleneck_margin``. The model step ticks every ``model_interval`` seconds until each
    autotuned stage has finished ``model_items`` items (at most ``model_ticks`` ticks);
    ``model=False`` skips it (hill-climbing only, as before the model existed). The
    window that judges a model step is ``check_ticks`` ticks of ``check_interval``
    seconds (after ``settle_ticks`` of them): the step is kept unless it goes over a
    budget, and a short window finds that out before a short epoch is over (at the
    default, 30 ms after the step instead of 400: a run of 3,000 items at 40,000/s lasts
    75 ms). Once the step is kept, the model looks again over ``look_ticks`` more such
    ticks, measured at the new concurrency, before the climb's first full window.
    """

    cpu_budget: float = DEFAULT_CPU_BUDGET
    memory_limit: int | None = None
    interval: float = 0.1
    settle_ticks: int = 1
    measure_ticks: int = 3
    min_gain: float = 0.03
    drift: float = 0.2
    drift_windows: int = 2
    cpu_tolerance: float = 0.1
    bottleneck_margin: float = 0.2
    model: bool = True
    model_interval: float = 0.001
    model_items: int = 2
    model_ticks: int = 150
    remodel_factor: float = 1.25
    check_interval: float = 0.01
    check_ticks: int = 2
    look_ticks: int = 4

    def __post_init__(self) -> None:
        if not 0 < self.cpu_budget <= 1:
            raise ValueError(
                f"cpu_budget must be a fraction of the machine's cores in (0, 1], "
                f"got {self.cpu_budget!r}"
            )
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError(
                f"memory_limit must be a positive number of bytes, got {self.memory_limit!r}"
            )
        if min(self.interval, self.model_interval, self.check_interval) <= 0:
            raise ValueError(
                f"the autotune intervals must be positive, got {self.interval!r} "
                f"(model_interval {self.model_interval!r}, "
                f"check_interval {self.check_interval!r})"
            )
        if min(self.measure_ticks, self.check_ticks, self.look_ticks) < 1 or self.settle_ticks < 0:
            raise ValueError(
                "measure_ticks, check_ticks and look_ticks must be >= 1, settle_ticks >= 0"
            )
        if self.model_items < 1 or self.model_ticks < 1:
            raise ValueError("model_items and model_ticks must be >= 1")


@dataclass(frozen=True)
class StageSample:
    """One stage over one tick. Occupancies are 0 (empty) to 1 (full).

    ``min_concurrency`` is the least the tuner may set. ``measured`` says whether the
    cost fields are filled: ``items`` finished over the tick, ``busy`` wall seconds and
    ``cpu_busy`` CPU seconds (None: not measured) inside the op for ``metered`` of them
    (None: for all of them; an autotuned stage meters a sample of its calls), summed over
    workers. Until the first of its metered calls finishes (async ops only), ``pending``
    were in flight at the tick's end, the first of them for ``pending_age`` seconds: the
    evidence there is before any item has finished.
    """

    name: str
    concurrency: int
    max_concurrency: int  # the concurrency of a fixed stage
    tunable: bool
    in_occupancy: float
    out_occupancy: float
    measured: bool = False
    items: int = 0
    busy: float = 0.0
    cpu_busy: float | None = None
    min_concurrency: int = 1  # the least the stage may run
    metered: int | None = None
    pending: int = 0
    pending_age: float = 0.0

    @property
    def costed(self) -> int:
        """How many items ``busy`` and ``cpu_busy`` were measured over."""
        return self.items if self.metered is None else self.metered


@dataclass(frozen=True)
class AutotuneSample:
    """The whole pipeline over one tick (``seconds`` long; 0: the configured interval)."""

    throughput: float  # items/s delivered to the consumer
    cpu: float  # process CPU time / (wall time * cores)
    rss: int | None  # resident bytes, None if unknown
    stages: tuple[StageSample, ...]
    seconds: float = 0.0


@dataclass(frozen=True)
class Decision:
    """One decision: ``stage`` set to ``concurrency`` (both None for a decision to hold)."""

    stage: str | None
    concurrency: int | None
    reason: str
