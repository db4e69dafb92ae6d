"""What a benchmark measures and keeps: a configuration, one run's figures, and all of a
configuration's runs.

These are the nouns every other benchmark module speaks (the runner makes samples, the
rerun rule judges them, the tables read results), so they sit below all of them with no
behaviour beyond reading their own fields. ``_measure.py`` says what each figure is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from _cpu_meter import FOREIGN_FLOOR_S, FOREIGN_LIMIT


@dataclass(frozen=True)
class Spec:
    """One configuration to measure: ``_cases.<fn>(**kwargs)`` for one implementation."""

    group: str  # the table it belongs to
    impl: str  # "torch" or "torch_spdl"
    param: int  # the swept value (concurrency, batch size) or 0
    fn: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # the case, for tables without a swept value


@dataclass
class Sample:
    """One measured run."""

    samples: int
    seconds: float
    cpu_s: float
    peak_mib: float | None = None  # a memory run's only (``_memory.py``)
    peak_where: str = ""  # a memory run's: what its peak was made of (``where_text``)
    first_batch_s: float | None = None
    foreign_cpu_s: float = 0.0  # other processes' CPU during the timed section

    def disturbed(self, cores: int) -> bool:
        """Other processes took more than ``FOREIGN_LIMIT`` of the section's cores (and more
        than ``FOREIGN_FLOOR_S``: the machine's own housekeeping is not a job; both in
        ``_cpu_meter.py``)."""
        return self.foreign_cpu_s > max(FOREIGN_FLOOR_S, FOREIGN_LIMIT * self.seconds * cores)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    def cpu_pct(self, cores: int) -> float:
        """Share of the machine's cores busy during the timed section, in percent."""
        return 100.0 * self.cpu_s / (self.seconds * cores) if self.seconds > 0 else float("nan")


@dataclass
class Result:
    """Every run of one configuration, or the error that stopped it."""

    spec: Spec
    runs: list[Sample] = field(default_factory=list)  # timed, without the memory sampler
    memory_runs: list[Sample] = field(default_factory=list)  # sampled, not timed
    error: str | None = None
    dropped: int = 0  # timed runs dropped and run again: other processes disturbed them
    disturbed: int = 0  # timed runs kept although disturbed (no tries or time left for more)

    def peaks(self) -> list[float]:
        """Peak memory of every run that sampled it, MiB."""
        return [s.peak_mib for s in (*self.memory_runs, *self.runs) if s.peak_mib is not None]
