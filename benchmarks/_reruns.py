"""Which disturbed runs are run again, and for how long the job may keep doing that.

Why a run can be refused and run again: the machine is shared, and 2 cores leave no room
for a third party. A timed run during which other processes took CPU (``Sample.disturbed``:
the rule and its reasons are in ``_cpu_meter.py``) is dropped and run again, at most
``retries`` times (:data:`RETRIES`); the last try is kept, with its figure.

Why a time budget on top: on a machine kept busy by something else, every try is disturbed
again, and retrying each one 4 times made the quick report take 395 s where it takes 1-2
minutes. :class:`RerunBudget` lets the reruns take at most ``share`` of the time the
planned runs take (projected, as they go, from the runs done so far), so the whole job
takes at most ``1 + share`` times its own runs' time on this machine as it is now. Once a
rerun does not fit, no run is run again: the figures keep the runs they have, each result
counts its disturbed runs (``Result.disturbed``) for the tables to mark, and
:func:`closing_note` says so in one line. Time comes from a clock given as a parameter, so
that a test can drive the budget without waiting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from _figures import DISTURBED
from _results import Result, Sample

RETRIES = 4  # tries after the first for a run that other processes disturbed
QUICK_SHARE = 0.25  # the quick report's reruns: at most a quarter of its runs' own time

T = TypeVar("T")


class RerunBudget:
    """The time the reruns of a job may take: ``share`` of the time of its ``planned``
    runs (``math.inf``: no bound), the runs timed on ``clock``."""

    def __init__(
        self, planned: int, share: float = math.inf, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.planned = planned
        self.share = share
        self.clock = clock
        self.first_s = 0.0  # wall time of the planned runs done so far
        self.first_runs = 0
        self.rerun_s = 0.0  # wall time of the reruns so far
        self.reruns = 0
        self.spent = False  # a rerun did not fit: from then on none is made

    def time(self, run: Callable[[], T], rerun: bool = False) -> tuple[T, float]:
        """``run()`` and its wall time, counted as a planned run or as a rerun."""
        t0 = self.clock()
        out = run()
        took = self.clock() - t0
        if rerun:
            self.rerun_s += took
            self.reruns += 1
        else:
            self.first_s += took
            self.first_runs += 1
        return out, took

    def allows(self, cost_s: float) -> bool:
        """Whether a rerun expected to take ``cost_s`` fits; the first that does not spends
        the budget (see the module's notes)."""
        if self.share == math.inf:
            return True
        if not self.spent:
            done = max(self.first_runs, 1)
            projected = self.first_s / done * max(self.planned, done)
            self.spent = self.rerun_s + cost_s > self.share * projected
        return not self.spent


def run_quietly(
    run: Callable[[], Sample], cores: int, retries: int, budget: RerunBudget
) -> tuple[Sample, int]:
    """One timed run, run again while other processes disturbed it, up to ``retries``
    times and while ``budget`` allows (each try expected to cost what the last took): the
    sample kept, and how many tries were dropped."""
    sample, took = budget.time(run)
    dropped = 0
    while dropped < retries and sample.disturbed(cores) and budget.allows(took):
        sample, took = budget.time(run, rerun=True)
        dropped += 1
    return sample, dropped


def progress_note(budget: RerunBudget) -> str:
    """The progress bar's words for the reruns so far ("" while there are none)."""
    if not budget.reruns:
        return ""
    runs = "run" if budget.reruns == 1 else "runs"
    return f"{budget.reruns} {runs} disturbed by other programs, run again"


def closing_note(results: Iterable[Result], budget: RerunBudget, retries: int) -> str:
    """One line for the end of a job: the reruns, and the figures that keep disturbed
    runs and why ("" when there is nothing to say)."""
    marked = sum(1 for r in results if r.disturbed)
    parts = [progress_note(budget)] if budget.reruns else []
    if marked:
        if budget.spent:
            why = "the time set aside for running again was spent"
        elif retries:
            why = f"still disturbed after {retries} tries"
        else:
            why = "not run again: --retries 0"
        figures = "figure keeps" if marked == 1 else "figures keep"
        parts.append(f"{marked} {figures} disturbed runs ({why}), marked {DISTURBED}")
    return "; ".join(parts)
