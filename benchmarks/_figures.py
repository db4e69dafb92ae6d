"""The figures of a measured result, as the report and the scripts' own tables print them.

A run's value for each metric (:data:`METRICS`), the median and min-max spread of a
result's runs, ``ours / torch`` with its verdict. ``_report.py`` writes the report from
these and imports the scripts with their own tables (``swap.py``, ``peers.py``), which
print their rows with the same figures: so the figures sit here, below both, and no
script imports the report back.

A figure whose runs other programs disturbed, kept because no tries or time were left to
run them again (``_reruns.py``), carries :data:`DISTURBED` in every table
(:func:`result_cell`), and the report says what the mark means (:func:`disturbed_note`):
a reader sees which figures to distrust without reading the log.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from _cpu_meter import cpu_count
from _results import Result, Sample

__all__ = [
    "CORES",
    "DISTURBED",
    "METRICS",
    "Metric",
    "disturbed_note",
    "figure_cell",
    "result_cell",
    "run_values",
    "spread",
    "versus",
]

CORES = cpu_count()


def spread(figures: list[float]) -> tuple[float, float, float] | None:
    """Median, min and max of ``figures`` (NaN left out); None when none is left."""
    figures = [v for v in figures if v == v]  # drop NaN
    if not figures:
        return None
    return statistics.median(figures), min(figures), max(figures)


def figure_cell(figures: list[float], digits: int = 0) -> str:
    """``figures`` as a table cell: the median, and the spread when the runs differ."""
    s = spread(figures)
    if s is None:
        return "not measured"
    med, lo, hi = s
    if len(figures) == 1 or lo == hi:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


Metric = Callable[[Sample], float]

METRICS: dict[str, tuple[str, Metric, bool, int]] = {
    # key: (column title, value of a run, higher is better, digits)
    "rate": ("{unit}/s", lambda s: s.rate, True, 0),
    "peak": (
        "peak memory, MiB",
        lambda s: s.peak_mib if s.peak_mib is not None else float("nan"),
        False,
        0,
    ),
    "cpu": (f"CPU, % of {CORES} cores", lambda s: s.cpu_pct(CORES), False, 0),
    "first": (
        "first batch, ms",
        lambda s: s.first_batch_s * 1000 if s.first_batch_s is not None else float("nan"),
        False,
        0,
    ),
}


def run_values(result: Result | None, metric: str) -> list[float]:
    """``metric`` of each of ``result``'s runs (peak memory: of its memory runs)."""
    if result is None or not result.runs:
        return []
    if metric == "peak":  # from the memory runs (see _measure's notes)
        return result.peaks()
    fn = METRICS[metric][1]
    return [fn(r) for r in result.runs]


DISTURBED = "†"  # after a figure whose kept runs other programs disturbed


def result_cell(result: Result | None, metric: str) -> str:
    """``figure_cell`` of ``result``'s ``metric``, with :data:`DISTURBED` after a timed
    figure (all but peak memory, which its own runs measure) that kept disturbed runs."""
    values = run_values(result, metric)
    marked = result is not None and result.disturbed and metric != "peak" and spread(values)
    return figure_cell(values) + (DISTURBED if marked else "")


def disturbed_note(results: list[Result]) -> list[str]:
    """The report's paragraph on runs that other programs disturbed (none: no lines)."""
    dropped = sum(r.dropped for r in results)
    marked = [r for r in results if r.disturbed]
    if not dropped and not marked:
        return []
    text = f"Timed runs that other programs disturbed, run again: {dropped}." if dropped else ""
    if marked:
        runs = sum(r.disturbed for r in marked)
        text += (
            f" Figures marked {DISTURBED} ({len(marked)}) keep {runs} disturbed runs in all "
            "(no tries or time were left to run them again: `run.py --retries`, "
            "`--rerun-budget`): other programs took CPU while they ran, so read their "
            "throughput as low and their times as long."
        )
    return [text.strip(), ""]


def versus(torch: Result | None, ours: Result | None, metric: str) -> tuple[str, str]:
    """``ours / torch`` of the medians and a verdict; blank where either was not measured."""
    t, o = spread(run_values(torch, metric)), spread(run_values(ours, metric))
    if t is None or o is None or t[0] == 0:
        return "-", "not compared"
    times = o[0] / t[0]
    higher_better = METRICS[metric][2]
    if min(len(run_values(torch, metric)), len(run_values(ours, metric))) < 2:
        verdict = "one run each: no verdict"
    elif o[1] <= t[2] and t[1] <= o[2]:
        verdict = "no clear difference (spreads overlap)"
    elif (o[0] > t[0]) == higher_better:
        verdict = "torch_spdl better"
    else:
        verdict = "torch better"
    return f"{times:.2f}x", verdict
