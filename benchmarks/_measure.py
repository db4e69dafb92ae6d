"""Measure benchmark cases: every configuration in fresh processes, its figures from outside
and inside, runs that other programs disturbed run again within a time budget.

This module is the face the benchmark scripts import (``from _measure import ...``): it
runs a plan (:func:`measure_all`) and re-exports the pieces it is made of, each in a
module of its own that says why it works as it does:

- ``_results.py``: a configuration (``Spec``), a run's figures (``Sample``), all runs of a
  configuration (``Result``);
- ``_runner.py``: one run in a fresh process (a forkserver child with torch imported; a
  memory run in a fresh interpreter);
- ``_cpu_meter.py``: CPU of the run's process tree, and of the other processes meanwhile;
- ``_memory.py``: peak memory of the process tree (summed PSS and unmapped shared files);
- ``_reruns.py``: which disturbed runs run again, and the time budget for that;
- ``_machine.py``: the machine and versions, for every report's header.

Measured for each run:

- ``samples`` and ``seconds``: one timed section (loader made, every batch read); the
  throughput is their ratio.
- ``first_batch_s``: loader made, ``iter()``, first ``next()`` (when the case can tell).
- ``cpu_s``: CPU time (user + system) of the process and all its children during the timed
  section. CPU utilisation is ``cpu_s / (seconds * cores)``.
- ``peak_mib``: peak memory of the run's process and all its descendants, only in the
  *memory runs*: every configuration runs once more with the memory sampler first (it
  costs the run CPU), and the timed runs go without it.
- ``foreign_cpu_s``: the CPU the whole machine used during the timed section less the
  run's own: another job's, which decides whether the run was disturbed.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Protocol

from _cpu_meter import FOREIGN_FLOOR_S, FOREIGN_LIMIT, CpuMeter, busy_cpu_s, cpu_count
from _machine import machine
from _memory import PeakMemory, pss_kb, pss_parts_kb, where_text
from _reruns import QUICK_SHARE, RETRIES, RerunBudget, closing_note, progress_note, run_quietly
from _results import Result, Sample, Spec
from _runner import PRELOAD, Runner

__all__ = [
    "FOREIGN_FLOOR_S",
    "FOREIGN_LIMIT",
    "PRELOAD",
    "QUICK_SHARE",
    "RETRIES",
    "CpuMeter",
    "PeakMemory",
    "Result",
    "Runner",
    "Sample",
    "Spec",
    "busy_cpu_s",
    "cpu_count",
    "interleave",
    "machine",
    "measure_all",
    "pss_kb",
    "pss_parts_kb",
    "where_text",
]


class RunsOne(Protocol):
    """What :func:`measure_all` runs each configuration with (``Runner``, or a test's)."""

    def run(self, spec: Spec, memory: bool = True) -> Sample: ...


def interleave(specs: list[Spec], repeats: int) -> list[Spec]:
    """The order of the runs: every configuration once, then again, ``repeats`` times, in
    reverse on odd rounds (so a pair's two sides take turns going first, and a burst of load
    from elsewhere on the machine spreads over every configuration)."""
    return [s for r in range(repeats) for s in (specs if r % 2 == 0 else specs[::-1])]


def measure_all(
    specs: list[Spec],
    repeats: int,
    desc: str = "benchmark runs",
    sample_s: float = 0.05,
    memory_runs: int = 1,
    fresh_memory: bool = True,
    retries: int = RETRIES,
    rerun_budget: float = math.inf,
    *,
    runner: RunsOne | None = None,
    clock: Callable[[], float] = time.monotonic,
    cores: int | None = None,
) -> list[Result]:
    """Every spec ``memory_runs`` times with the memory sampler, then ``repeats`` times
    timed without it, all in ``interleave`` order, each in a fresh process, with a progress
    bar; a spec that fails once is not run again and keeps its error.

    A timed run that other processes disturbed is run again, up to ``retries`` times (0
    where nobody reads the figures, as in CI beside the tests), while the reruns have taken
    at most ``rerun_budget`` of the planned runs' time (``_reruns.py``); the bar counts the
    reruns and one line at the end says what was run again and which figures keep
    disturbed runs. ``fresh_memory`` False (quick modes): memory runs are forkserver
    children too, 2 s sooner each. ``runner``, ``clock`` and ``cores`` stand in for the
    fresh processes, the time and the machine's cores in tests."""
    from tqdm import tqdm

    results = {s: Result(s) for s in specs}
    runner = runner or Runner(sample_s=sample_s, fresh_memory=fresh_memory)
    cores = cores or cpu_count()
    order = [(s, True) for s in interleave(specs, memory_runs)]
    order += [(s, False) for s in interleave(specs, repeats)]
    budget = RerunBudget(len(order), rerun_budget, clock)
    with tqdm(total=len(order), desc=desc, unit="run", dynamic_ncols=True) as bar:
        for spec, memory in order:
            result = results[spec]
            run = functools.partial(runner.run, spec, memory)
            try:
                if memory and not result.error:
                    result.memory_runs.append(budget.time(run)[0])
                elif not result.error:
                    sample, dropped = run_quietly(run, cores, retries, budget)
                    result.dropped += dropped
                    result.disturbed += sample.disturbed(cores)
                    result.runs.append(sample)
            except Exception as exc:  # keep going: the report names what failed
                result.error = str(exc)
                tqdm.write(f"FAILED: {exc}")
            bar.set_postfix_str(progress_note(budget), refresh=False)
            bar.update()
    note = closing_note(results.values(), budget, retries)
    if note:
        print(note, flush=True)
    return list(results.values())
