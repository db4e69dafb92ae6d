"""The swap benchmark's plot: torch_spdl / torch per cell and worker count, throughput and
peak PSS side by side, on a log scale centred on 1 (a ratio of 2 and of 0.5 read alike).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _consumers import CONSUMERS
from _figures import run_values, spread
from _results import Result
from _swap_tables import rows, target_of


def _ratio_spread(t: Result | None, o: Result | None, metric: str) -> tuple[float, ...] | None:
    """Median ratio ours / torch, and the lowest and highest ratio the spreads allow."""

    ts, os_ = spread(run_values(t, metric)), spread(run_values(o, metric))
    if ts is None or os_ is None or ts[0] == 0:
        return None
    return os_[0] / ts[0], os_[1] / ts[2], os_[2] / ts[1]


def _ratio_panel(ax: Any, table: list, metric: str, workers: list[int], names: list[str]) -> None:
    """Bars from 1 to the median ratio (log scale), one per worker count, spread as whiskers."""
    import matplotlib.ticker as mticker

    width = 0.8 / len(workers)
    for j, w in enumerate(workers):
        label: str | None = f"num_workers={w}"
        for name, wk, t, o in table:
            r = _ratio_spread(t, o, metric)
            if wk != w or r is None:
                continue
            x = names.index(name) + (j - (len(workers) - 1) / 2) * width
            yerr = [[r[0] - r[1]], [r[2] - r[0]]]
            ax.bar(x, r[0] - 1, width, bottom=1, color=f"C{j}", label=label)
            ax.errorbar(x, r[0], yerr=yerr, color="black", capsize=2, linewidth=0.8)
            label = None
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log", base=2)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0.5), max(hi, 2.0))
    ax.yaxis.set_major_locator(
        mticker.FixedLocator([2.0**k for k in range(-5, 6)] + [0.75, 1.5, 3])
    )
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(mticker.NullFormatter())
    ticks = [_short(n) for n in names]
    ax.set_xticks(range(len(names)), ticks, rotation=30, ha="right", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def plot(path: Path, results: list[Result]) -> bool:
    """torch_spdl / torch per cell and worker count: throughput, and peak PSS; the 2x
    throughput targets as dashes."""
    import matplotlib.pyplot as plt

    table = rows(results)
    names = list(dict.fromkeys(name for name, *_ in table))
    if not names:
        return False
    workers = sorted({w for _, w, *_ in table})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, metric in zip(axes, ("rate", "peak"), strict=True):
        _ratio_panel(ax, table, metric, workers, names)
    for i, name in enumerate(names):
        target = target_of(name)
        if target is not None and target != 1.0:
            axes[0].hlines(target, i - 0.45, i + 0.45, colors="red", linestyles="dashed")
    axes[0].set_title("throughput, torch_spdl / torch (above 1: faster; red: target)", fontsize=9)
    axes[1].set_title("peak PSS, torch_spdl / torch (below 1: less memory)", fontsize=9)
    axes[0].set_ylabel("ratio of medians (whiskers: spread)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _short(name: str) -> str:
    short = name.split(",")[0]
    for consumer in CONSUMERS[1:]:
        if f"consumer {consumer}" in name:
            short += f" ({consumer})"
    if "staged" in name:
        short += " (staged)"
    if "'thread'" in name:
        short += " (thread)"
    return short
