"""The swap benchmark's tables: throughput against each row's target, then memory, first
batch and CPU, in the report and in ``swap.py``'s own output.

Every row compares torch's loader with one of ours in one cell. Its verdict is on the
medians; the "side by side" column also compares the runs that ran next to each other
(on this shared machine a cell's runs move by 20% over a table's hour, which pairs share
and medians do not); peak memory is judged as a tie unless every run of ours is above
every run of torch's (a training process's peak is bimodal run to run).
"""

from __future__ import annotations

import numpy as np
from _consumers import CONSUMERS
from _figures import METRICS, result_cell, run_values, spread, versus
from _results import Result
from _swap_cells import CELLS, IMPLS, STAGED, THREAD, split_label

#: What a variant row of ours is asked to reach, where it differs from its cell's target:
#: staged as migrate stages it, the I/O wait runs on many threads; ``worker_type="thread"``
#: is an explicit choice that gives up torch's reproducibility and crash isolation
#: (docs/dataloader.md), shown for what it trades, with no target (None).
_VARIANT_TARGETS: dict[str, float | None] = {STAGED: 1.5, THREAD: None}
_VARIANT_NAMES = {
    STAGED: ", ours staged as `migrate` splits it",
    THREAD: ", ours `worker_type='thread'`",
}


def _by_cell(results: list[Result]) -> dict[tuple[str, int], dict[str, Result]]:
    out: dict[tuple[str, int], dict[str, Result]] = {}
    for r in results:
        if r.spec.group == "swap":
            out.setdefault((r.spec.label, r.spec.param), {})[r.spec.impl] = r
    order = [c.key for c in CELLS]

    def rank(kv: tuple[tuple[str, int], dict[str, Result]]) -> tuple[int, int, int]:
        cell, consumer = split_label(kv[0][0])
        return order.index(cell.key), CONSUMERS.index(consumer), kv[0][1]

    return dict(sorted(out.items(), key=rank))


def rows(results: list[Result]) -> list[tuple[str, int, Result | None, Result | None]]:
    """(row name, workers, torch, ours) for every measured comparison, variants after."""
    out = []
    for (label, workers), by_impl in _by_cell(results).items():
        cell, consumer = split_label(label)
        for impl in (*IMPLS[1:], *cell.variants):
            if impl in by_impl:
                name = cell.title
                if consumer != "touch":
                    name += f", consumer {consumer}"
                name += _VARIANT_NAMES.get(impl, "")
                out.append((name, workers, by_impl.get("torch"), by_impl[impl]))
    return out


def target_status(torch_r: Result | None, ours: Result | None, metric: str, target: float) -> str:
    """Whether ``ours`` meets ``target`` x torch (rates: at least; memory: at most), on the
    medians, and whether the spreads make it clear."""

    t, o = spread(run_values(torch_r, metric)), spread(run_values(ours, metric))
    if t is None or o is None:
        return "not measured"
    sign = 1 if METRICS[metric][2] else -1  # compare as "higher is better"
    med_ok = sign * o[0] >= sign * target * t[0]
    worst_o, best_o = (o[1], o[2]) if sign > 0 else (o[2], o[1])
    worst_t, best_t = (t[1], t[2]) if sign > 0 else (t[2], t[1])
    if sign * worst_o >= sign * target * best_t:
        return "met"
    if sign * best_o < sign * target * worst_t:
        return "**not met**"
    return "met on medians (spreads overlap)" if med_ok else "not met on medians (spreads overlap)"


def side_by_side(torch_r: Result | None, ours: Result | None) -> str:
    """The runs compared in pairs: the median of ours / torch over the pairs, and in how
    many pairs ours was at least as fast. The k-th timed run of each side ran in the same
    round of ``_measure.interleave``, next to each other, so a pair shares the machine's
    state of that moment (other tenants, frequency) that the medians of the two sides mix
    with the rest of the table's time. Shown beside the verdict, which is on the medians."""
    rates = zip(run_values(torch_r, "rate"), run_values(ours, "rate"), strict=False)
    pairs = [o / t for t, o in rates if t > 0]  # zip: a side that failed has fewer runs
    if not pairs:
        return "not measured"
    ahead = sum(r >= 1.0 for r in pairs)
    return f"{float(np.median(pairs)):.2f}x, ahead in {ahead} of {len(pairs)}"


def memory_status(torch_r: Result | None, ours: Result | None) -> str:
    """Whether our peak PSS is at most torch's. A training process's peak is bimodal run
    to run, for torch and for us (docs/benchmarks.md: a full collection after the workers
    fork copies the pages it shares with them, or does not), so medians of a few runs land
    on either mode: a row is above torch only when every run of ours is above every run of
    torch's; medians above with overlapping runs are a tie, and say so."""
    t, o = spread(run_values(torch_r, "peak")), spread(run_values(ours, "peak"))
    if t is None or o is None:
        return "not measured"
    if o[0] <= t[0]:
        return "met"
    if o[1] > t[2]:
        return "**not met**"
    return "met: a tie (median above, runs within torch's)"


def target_of(name: str) -> float | None:
    """The throughput target of a row: its cell's, or its variant's (None: no target)."""
    cell = next(c for c in CELLS if name.startswith(c.title))
    variant = next((v for v, text in _VARIANT_NAMES.items() if name.endswith(text)), None)
    return _VARIANT_TARGETS.get(variant, cell.target) if variant else cell.target


def tables(results: list[Result]) -> list[str]:
    """Markdown: throughput with targets, then peak memory, first batch and CPU."""

    cpu_title = METRICS["cpu"][0]
    head1 = (
        "| cell | workers | torch samples/s | torch_spdl samples/s | ratio | verdict | target "
        "| side by side |"
    )
    head2 = (
        "| cell | workers | torch peak PSS, MiB | torch_spdl peak PSS, MiB | ratio | target "
        "(<= torch, beyond the runs' spread) | torch first batch, ms | torch_spdl first batch, "
        f"ms | torch {cpu_title} | torch_spdl {cpu_title} |"
    )
    speed = [head1, "| --- | ---: |" + " ---: |" * 3 + " --- | --- | --- |"]
    memory = [head2, "| --- | ---: |" + " ---: |" * 3 + " --- |" + " ---: |" * 4]
    for name, workers, t, o in rows(results):
        goal = target_of(name)
        ratio, verdict = versus(t, o, "rate")
        target = (
            "none (an explicit choice)"
            if goal is None
            else f">= {goal:.1f}x: {target_status(t, o, 'rate', goal)}"
        )
        rate_t, rate_o = (result_cell(r, "rate") for r in (t, o))
        speed.append(
            f"| {name} | {workers} | {rate_t} | {rate_o} | {ratio} | {verdict} | {target} "
            f"| {side_by_side(t, o)} |"
        )
        peak_ratio, _ = versus(t, o, "peak")
        cells = [result_cell(r, m) for m in ("first", "cpu") for r in (t, o)]
        peak_t, peak_o = (result_cell(r, "peak") for r in (t, o))
        memory.append(
            f"| {name} | {workers} | {peak_t} | {peak_o} "
            f"| {peak_ratio} | {memory_status(t, o)} | " + " | ".join(cells) + " |"
        )
    return ["### Throughput", "", *speed, "", "### Peak memory, first batch, CPU", "", *memory]


def peak_listing(results: list[Result]) -> list[str]:
    """Markdown: what each memory run's peak was made of, by process and kind (MiB)."""
    lines = ["", "### Where each peak was (MiB)", ""]
    listed: set[int] = set()  # torch's result heads its cell's variant rows too: once
    for name, workers, *pair in rows(results):
        for result in pair:
            if result is None or id(result) in listed:
                continue
            listed.add(id(result))
            for run in result.memory_runs:
                where = run.peak_where or "not recorded"
                lines.append(
                    f"- {name}, {workers} workers, {result.spec.impl}: {run.peak_mib:.0f} = {where}"
                )
    return lines


def report_text(results: list[Result], peaks: bool) -> str:
    """The tables, and with ``peaks`` what each memory run's peak was made of."""
    return "\n".join(tables(results) + (peak_listing(results) if peaks else []))
