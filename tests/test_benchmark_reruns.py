"""The benchmarks on a busy machine: which disturbed runs run again, within what time, what
the job prints and how the report marks what it kept (benchmarks/_reruns.py, _measure.py,
_report.py), driven by a made-up machine: its clock moves only when a run runs."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

pytest.importorskip("psutil")
pytest.importorskip("tqdm")

from _measure import Result, Sample, Spec, measure_all  # noqa: E402
from _reruns import RerunBudget  # noqa: E402

CORES = 2


@pytest.fixture(autouse=True)
def _no_bar_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm's monitor thread outlives the bar in this version: none in these tests."""
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)


class Machine:
    """A clock, and a runner whose every run takes ``took`` seconds of it; a run that starts
    while ``busy(now)`` holds has others take a whole core meanwhile (disturbed)."""

    def __init__(self, took: float = 1.0, busy: Callable[[float], bool] = lambda _: True):
        self.now = 0.0
        self.took = took
        self.busy = busy
        self.runs: list[tuple[Spec, bool]] = []

    def clock(self) -> float:
        return self.now

    def run(self, spec: Spec, memory: bool = True) -> Sample:
        foreign = self.took if self.busy(self.now) else 0.0
        self.now += self.took
        self.runs.append((spec, memory))
        return Sample(samples=100, seconds=self.took, cpu_s=0.5, foreign_cpu_s=foreign)


SPECS = [Spec("strings", impl, 4, "strings") for impl in ("torch", "torch_spdl")]


def _measure(machine: Machine, **kw: Any) -> list[Result]:
    return measure_all(SPECS, 3, runner=machine, clock=machine.clock, cores=CORES, **kw)


def test_a_busy_machine_stops_the_reruns_when_their_time_is_spent(capsys) -> None:
    machine = Machine()  # every run disturbed: 2 memory runs, then 6 timed ones, 1 s each
    results = _measure(machine, retries=4, rerun_budget=0.25)
    assert machine.now == pytest.approx(8 * 1.25)  # a quarter of the 8 planned runs' time
    assert [r.dropped for r in results] == [2, 0]  # the first timed run twice, then none
    assert [r.disturbed for r in results] == [3, 3]  # every figure keeps what it has
    assert [len(r.runs) for r in results] == [3, 3]
    assert [len(r.memory_runs) for r in results] == [1, 1]
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "2 runs disturbed by other programs, run again; 2 figures keep disturbed runs "
        "(the time set aside for running again was spent), marked †"
    ]


def test_without_a_budget_each_disturbed_run_gets_its_tries(capsys) -> None:
    machine = Machine()
    results = _measure(machine, retries=4)  # full mode: no bound on the reruns' time
    assert [r.dropped for r in results] == [12, 12]  # 3 timed runs, 4 tries each
    assert machine.now == 8 + 24
    assert [r.disturbed for r in results] == [3, 3]
    assert "still disturbed after 4 tries" in capsys.readouterr().out


def test_a_burst_of_load_is_run_again_and_nothing_stays_marked(capsys) -> None:
    machine = Machine(busy=lambda now: 2 <= now < 4)  # others busy for the 3rd and 4th run
    results = _measure(machine, retries=4, rerun_budget=0.25)
    assert sum(r.dropped for r in results) == 2  # the first timed run, twice
    assert [r.disturbed for r in results] == [0, 0]
    assert capsys.readouterr().out.splitlines() == ["2 runs disturbed by other programs, run again"]


def test_a_quiet_machine_prints_nothing_beside_the_bar(capsys) -> None:
    results = _measure(Machine(busy=lambda _: False), rerun_budget=0.25)
    assert [(r.dropped, r.disturbed, len(r.runs)) for r in results] == [(0, 0, 3), (0, 0, 3)]
    assert capsys.readouterr().out == ""


def test_retries_zero_runs_nothing_again_and_says_why(capsys) -> None:
    machine = Machine()
    results = _measure(machine, retries=0, rerun_budget=0.25)  # CI's miniature job
    assert machine.now == 8 and [r.disturbed for r in results] == [3, 3]
    assert capsys.readouterr().out.splitlines() == [
        "2 figures keep disturbed runs (not run again: --retries 0), marked †"
    ]


def test_a_failed_configuration_keeps_its_error_and_is_not_run_again(capsys) -> None:
    class Failing(Machine):
        def run(self, spec: Spec, memory: bool = True) -> Sample:
            if spec.impl == "torch":
                raise RuntimeError("boom")
            return super().run(spec, memory)

    machine = Failing(busy=lambda _: False)
    results = _measure(machine, rerun_budget=0.25)
    assert results[0].error == "boom" and not results[0].runs
    assert len(machine.runs) == 4 and len(results[1].runs) == 3
    assert "FAILED: boom" in capsys.readouterr().out


def test_the_budget_is_a_share_of_the_planned_runs_projected_as_they_go() -> None:
    now = [0.0]

    def run(seconds: float) -> Callable[[], None]:
        def go() -> None:
            now[0] += seconds

        return go

    budget = RerunBudget(planned=10, share=0.5, clock=lambda: now[0])
    assert budget.time(run(2.0)) == (None, 2.0)  # projected: 10 runs of 2 s, reruns 10 s
    assert budget.allows(9.0)
    budget.time(run(9.0), rerun=True)
    assert (budget.reruns, budget.rerun_s) == (1, 9.0)
    assert budget.allows(1.0)  # 10 s: just fits
    assert not budget.allows(1.5) and budget.spent
    assert not budget.allows(0.0)  # once spent, no rerun fits any more
    assert RerunBudget(10, math.inf, clock=lambda: now[0]).allows(1e9)  # no bound
    assert not RerunBudget(10, 0.0, clock=lambda: now[0]).allows(0.5)


def test_the_report_marks_the_figures_that_keep_disturbed_runs(tmp_path: Path) -> None:
    from _report import write_report

    def result(impl: str, param: int, disturbed: int) -> Result:
        runs = [Sample(100, 1.0, 1.0, first_batch_s=0.1) for _ in range(3)]
        r = Result(Spec("images-concurrency", impl, param, "images"), runs, dropped=1)
        r.memory_runs = [Sample(100, 1.0, 1.0, peak_mib=300.0)]
        r.disturbed = disturbed
        return r

    results = [result("torch", 1, 0), result("torch_spdl", 1, 2), result("torch", 2, 0)]
    results.append(result("torch_spdl", 2, 0))
    text = write_report(tmp_path, results, {}, quick=True, repeats=3, elapsed_s=1.0).read_text()
    assert "run again: 4." in text  # the header counts the reruns
    assert "Figures marked † (1) keep 2 disturbed runs" in text
    row1 = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    cells = row1.split(" | ")
    assert cells[1:3] == ["100", "100†"]  # throughput: torch's clean, ours marked
    assert cells[3:5] == ["300", "300"]  # peak memory comes from runs of its own: no mark
    assert [c.endswith("†") for c in cells[5:7]] == [False, True]  # CPU
    assert cells[7:9] == ["100", "100†"]  # first batch, ms
    row2 = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "†" not in row2

    clean = [result("torch", 1, 0), result("torch_spdl", 1, 0)]
    for r in clean:
        r.dropped = 0
    text = write_report(tmp_path, clean, {}, quick=True, repeats=3, elapsed_s=1.0).read_text()
    assert "†" not in text and "run again" not in text


def test_the_swap_and_peers_tables_mark_them_too() -> None:
    import peers
    import swap

    def result(spec: Spec, disturbed: int) -> Result:
        runs = [Sample(100, 1.0, 1.0, peak_mib=300.0, first_batch_s=0.1) for _ in range(3)]
        return Result(spec, runs, disturbed=disturbed)

    cell = (("cell", "ints"),)
    swapped = [
        result(Spec("swap", "torch", 2, "swap_cell", cell, "ints"), 0),
        result(Spec("swap", "torch_spdl", 2, "swap_cell", cell, "ints"), 1),
    ]
    speed = next(line for line in swap.tables(swapped) if line.startswith("| 6. trivial ints"))
    assert speed.split(" | ")[2:4] == ["100", "100†"]
    peer = Spec("peers", "torch_spdl sync", 0, "peer_case", (("workload", "io"),), label="io")
    row = next(line for line in peers.tables([result(peer, 1)]) if "torch_spdl sync" in line)
    rate, cpu, peak = row.split(" | ")[2:5]  # items/s, CPU ms per item, peak PSS
    assert rate.endswith("†") and cpu.endswith("†") and "†" not in peak
