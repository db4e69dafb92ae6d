"""The peers benchmark's tables, targets and plot, in the report and in ``peers.py``'s output.

One table per workload (rate, CPU per item, peak PSS of each contender, medians with the
min-max spread), then the issue's targets, each judged on the medians: a target compares
our best-suited row with the best peer row, not with the worst.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _figures import DISTURBED
from _peer_plan import CONTENDERS, DEEP, GROUP, UNITS
from _results import Result


def _of(results: list[Result], workload: str) -> dict[str, Result]:
    return {
        r.spec.impl: r
        for r in results
        if r.spec.group == GROUP and r.spec.label == workload and r.runs
    }


def _med(r: Result | None, fn: Callable[[Any], float]) -> float:
    return statistics.median(fn(s) for s in r.runs) if r is not None and r.runs else float("nan")


def _rate(r: Result | None) -> float:
    return _med(r, lambda s: s.rate)


def _cpu_ms(r: Result | None) -> float:
    return _med(r, lambda s: 1000 * s.cpu_s / s.samples if s.samples else math.nan)


def _spread(values: list[float], digits: int) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _best(rs: dict[str, Result], prefix: str) -> tuple[str, Result | None]:
    found = [(k, r) for k, r in rs.items() if k.startswith(prefix)]
    if not found:
        return "", None
    return max(found, key=lambda kr: _rate(kr[1]))


def targets(results: list[Result]) -> list[tuple[str, str, str]]:
    """The issue's targets: (target, measured, verdict on the medians)."""
    out: list[tuple[str, str, str]] = []

    def ratio(what: str, ours: Result | None, peer: Result | None, need: float) -> None:
        if ours is None or peer is None:
            out.append((what, "not measured", "-"))
            return
        x = _rate(ours) / _rate(peer)
        out.append((what, f"{x:.2f}x", "met" if x >= need else "not met"))

    v = _of(results, "video")
    ours = v.get("torch_spdl")
    for peer in ("spdl", "pyav seek"):
        ratio(f"video: clips/s >= 1.2x {peer}", ours, v.get(peer), 1.2)
        if ours is not None and peer in v:
            a, b = _cpu_ms(ours), _cpu_ms(v[peer])
            verdict = "met" if a < b else "not met"
            out.append((f"video: CPU per clip < {peer}", f"{a:.0f} vs {b:.0f} ms", verdict))
    j = _of(results, "jpeg")
    name, tv = _best(j, "torch_spdl + torchvision")
    ratio(
        f"jpeg: >= 1.1x same engine + torchvision (best: {name or '-'})",
        j.get("torch_spdl"),
        tv,
        1.1,
    )
    e = _of(results, "engine")
    pre, td = _best(e, "torchdata")
    for mode in ("sync", "async"):
        ratio(
            f"engine {mode}: >= 1.2x torchdata (best: {pre or '-'})",
            e.get(f"torch_spdl {mode}"),
            td,
            1.2,
        )
        ratio(
            f"engine {mode}, queue_size={DEEP} (fewer items in flight): >= 1.2x torchdata",
            e.get(f"torch_spdl {mode}, queue_size={DEEP}"),
            td,
            1.2,
        )
    o = _of(results, "io")
    for mode in ("sync", "async"):
        r = o.get(f"torch_spdl {mode}")
        if r is None:
            out.append((f"io {mode}: >= 95% of the 3,200/s limit", "not measured", "-"))
            continue
        share = _rate(r) / 3200
        verdict = "met" if share >= 0.95 else "not met"
        out.append((f"io {mode}: >= 95% of the 3,200/s limit", f"{share:.0%}", verdict))
    return out


def tables(results: list[Result], skipped: list[str] | None = None) -> list[str]:
    """Markdown: one table per workload, then the targets."""
    lines: list[str] = []
    for workload, contenders in CONTENDERS.items():
        rs = _of(results, workload)
        failed = [
            r for r in results if r.spec.group == GROUP and r.spec.label == workload and r.error
        ]
        if not rs and not failed:
            continue
        unit = UNITS[workload]
        lines += [
            f"**{workload}**",
            "",
            f"| contender | what | {unit}/s | CPU ms per {unit[:-1]} | peak PSS, MiB |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for name, _, what in contenders:
            r = rs.get(name)
            if r is None:
                continue
            rates = [s.rate for s in r.runs]
            cpu = [1000 * s.cpu_s / s.samples if s.samples else math.nan for s in r.runs]
            peak = r.peaks()
            mark = DISTURBED if r.disturbed else ""  # timed figures only: not peak memory
            lines.append(
                f"| {name} | {what} | {_spread(rates, 1 if workload == 'video' else 0)}{mark} | "
                f"{_spread(cpu, 3 if workload in ('engine', 'io') else 1)}{mark} | "
                f"{_spread(peak, 0)} |"
            )
        lines += [f"| {r.spec.impl} | failed: {r.error} | | | |" for r in failed]
        lines.append("")
    lines += [f"- {s}" for s in skipped or []]
    lines += ["", "| target | measured (medians) | verdict |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(results)]
    return lines


def plot(path: Path, results: list[Result]) -> bool:
    """Throughput of every contender, relative to the best peer of its workload."""
    import matplotlib.pyplot as plt

    workloads = [w for w in CONTENDERS if _of(results, w)]
    if not workloads:
        return False
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        rs = _of(results, w)
        names = [n for n, _, _ in CONTENDERS[w] if n in rs]
        meds = [_rate(rs[n]) for n in names]
        lo = [m - min(s.rate for s in rs[n].runs) for m, n in zip(meds, names, strict=True)]
        hi = [max(s.rate for s in rs[n].runs) - m for m, n in zip(meds, names, strict=True)]
        colors = ["#2b6cb0" if n.startswith("torch_spdl") else "#d9822b" for n in names]
        ax.barh(range(len(names)), meds, xerr=[lo, hi], color=colors, capsize=2)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{UNITS[w]}/s (median, min-max)", fontsize=8)
        ax.set_title(w, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
