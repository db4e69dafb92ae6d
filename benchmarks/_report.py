"""Write the benchmark report: ``REPORT.md`` with tables and PNG plots (matplotlib).

Figures are medians with the min-max spread of the runs. A ratio is printed only where both
implementations ran the same configuration, and a verdict says "no clear difference" when
the two spreads overlap: the report never claims a win it did not measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import peers
import swap
from _figures import CORES, METRICS, disturbed_note, result_cell, run_values, spread, versus
from _measure import Result


@dataclass(frozen=True)
class Group:
    title: str
    param: str  # the swept value's name, or "" for a table of named cases
    unit: str  # what one sample is
    what: str  # how the two sides are configured


GROUPS: dict[str, Group] = {
    "images-concurrency": Group(
        "Concurrency sweep: 3x224x224 uint8 samples, batch 32",
        "concurrency",
        "samples",
        "torch: `num_workers=c` processes; torch_spdl: `num_workers=c` threads (default "
        "knobs). 147 KiB samples, cheap to make and heavy to move; the consumer reads every "
        "page of each batch.",
    ),
    "io-concurrency": Group(
        "Concurrency sweep: 10 ms of I/O per sample, batch 16",
        "concurrency",
        "samples",
        "torch: `num_workers=c`, `time.sleep(0.01)` in `__getitem__`; torch_spdl: a "
        "`StagedDataset` whose sync `load` sleeps, `io_concurrency=c`. The limit at "
        "concurrency c is 100c samples/s; torch_spdl threads also go far past 8 "
        "(`benchmarks/dataloader.py` measures 128 and 512), which this sweep does not show.",
    ),
    "images-batch": Group(
        "Batch-size sweep: 3x224x224 uint8 samples",
        "batch size",
        "samples",
        "torch: `num_workers=2`; torch_spdl: `num_workers=1, collate_concurrency=2, "
        "buffer_size=4` (as in `benchmarks/dataloader.py`); two epochs of one loader.",
    ),
    "decode": Group(
        "JPEG decode + resize to 224x224, 2 workers (500x375 files on disk)",
        "batch size",
        "images",
        "torch: `DataLoader(num_workers=2)` over torchvision `ImageFolder` with PIL "
        "`Resize((224, 224))`; torch_spdl: read + decode on 2 threads with `torch_spdl.io`, "
        "`convert_frames` into one buffer per batch (`benchmarks/image_decode.py`).",
    ),
    "strings": Group(
        "Memory: a dataset of Python strings, 4 workers, batch 256, shuffled",
        "workers",
        "samples",
        "Every access writes a string's refcount, so torch's forked workers copy the pages "
        "they touch; torch_spdl's threads share the dataset. One epoch.",
    ),
    "engine": Group(
        "Engine: items/s through stages (ints as items)",
        "",
        "items",
        "`benchmarks/engine.py`'s cases: no-op and sleeping stages of the engine, and torch's "
        "DataLoader on the same ints for reference. Different work per row: no ratio.",
    ),
    "swap": Group(
        "Swap the import: the same script with torch's DataLoader or torch_spdl's",
        "workers",
        "samples",
        "`benchmarks/swap.py`: one training loop, given the DataLoader class and only "
        "`dataset, batch_size, num_workers` (`shuffle=True` for the path strings): every "
        "other argument is each side's default (worker processes for both). The target "
        "column is the issue's: at least 1.0x torch (1.5x for the 10 ms I/O dataset staged "
        "as `torch-spdl migrate` splits it; none for `worker_type='thread'`, an explicit "
        "choice shown for what it trades), peak PSS at most torch's; *met* when the "
        "spreads separate, *on medians* when only the medians do (peak PSS, bimodal run to "
        "run: *not met* only when every run of ours is above every run of torch's). The "
        "path strings read a "
        "fixed number of batches, not an epoch. The consumer is `touch` (reads every page "
        "of a batch) unless the row names `train` (a small CNN's step per batch) or `gpu` "
        "(2 ms holding the GIL, then 8 ms waiting without it).",
    ),
    "peers": Group(
        "Side by side with the peers: SPDL 0.8, torchdata 0.11, plain PyAV and torchvision",
        "",
        "items",
        "`benchmarks/peers.py` (its docstring says what each contender runs): sampled "
        "video decoding, a JPEG pipeline, the engine with no-op stages, and 10 ms of I/O "
        "per item, each contender in fresh processes, alternated. The last table holds "
        "the targets of issue 30, judged on the medians. A peer that is not installed is "
        "skipped and named.",
    ),
}
NAMED = ("engine", "swap", "peers")  # groups with their own tables, outside the paired sweeps


# -- tables ---------------------------------------------------------------------------------


def _pairs(results: list[Result], group: str) -> dict[int, dict[str, Result]]:
    out: dict[int, dict[str, Result]] = {}
    for r in results:
        if r.spec.group == group:
            out.setdefault(r.spec.param, {})[r.spec.impl] = r
    return dict(sorted(out.items()))


def _paired_table(results: list[Result], key: str) -> list[str]:
    g = GROUPS[key]
    rate_title = METRICS["rate"][0].format(unit=g.unit)
    metrics = ["rate", "peak", "cpu"] + (["first"] if key != "decode" else [])
    head = [g.param]
    for m in metrics:
        title = rate_title if m == "rate" else METRICS[m][0]
        head += [f"torch {title}", f"torch_spdl {title}"]
    head += ["throughput ratio", "verdict"]
    rule = "|" + " --- |" + " ---: |" * (len(head) - 2) + " --- |"
    lines = ["| " + " | ".join(head) + " |", rule]
    for param, pair in _pairs(results, key).items():
        torch, ours = pair.get("torch"), pair.get("torch_spdl")
        row = [str(param)]
        for m in metrics:
            row += [result_cell(torch, m), result_cell(ours, m)]
        row += list(versus(torch, ours, "rate"))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _engine_table(results: list[Result]) -> list[str]:
    lines = [
        "| case | runs on | items/s | CPU, % of cores | peak memory, MiB |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in results:
        if r.spec.group != "engine":
            continue
        lines.append(
            f"| {r.spec.label} | {r.spec.impl} | {result_cell(r, 'rate')} | "
            f"{result_cell(r, 'cpu')} | {result_cell(r, 'peak')} |"
        )
    return lines


def _comparisons(results: list[Result]) -> list[tuple[Result | None, Result | None]]:
    """(torch, torch_spdl) of every paired configuration, the swap cells included."""
    out = [
        (pair.get("torch"), pair.get("torch_spdl"))
        for key in GROUPS
        if key not in NAMED
        for pair in _pairs(results, key).values()
    ]
    return out + [(t, o) for _, _, t, o in swap.rows(results)]


def _summary(results: list[Result]) -> list[str]:
    """Counts of measured comparisons, by verdict, per metric: no claim beyond them."""
    lines = [
        "| metric | compared configurations | torch_spdl better | torch better | "
        "no clear difference |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for m in ("rate", "peak", "cpu", "first"):
        counts = {"torch_spdl better": 0, "torch better": 0, "no clear": 0}
        total = 0
        for torch, ours in _comparisons(results):
            _, verdict = versus(torch, ours, m)
            if verdict in ("not compared", "one run each: no verdict"):
                continue
            total += 1
            counts["no clear" if verdict.startswith("no clear") else verdict] += 1
        if total == 0:
            continue
        title = "throughput" if m == "rate" else METRICS[m][0].split(",")[0]
        higher = "higher" if METRICS[m][2] else "lower"
        lines.append(
            f"| {title} ({higher} is better) | {total} | {counts['torch_spdl better']} | "
            f"{counts['torch better']} | {counts['no clear']} |"
        )
    return lines


# -- plots ----------------------------------------------------------------------------------

COLORS = {"torch": "#d9822b", "torch_spdl": "#2b6cb0"}


def _errorbar(values: list[float]) -> tuple[float, float, float] | None:
    s = spread(values)
    if s is None:
        return None
    med, lo, hi = s
    return med, med - lo, hi - med


def _plot_lines(path: Path, results: list[Result], keys: list[str], xlabel: str) -> bool:
    import matplotlib.pyplot as plt

    keys = [k for k in keys if _pairs(results, k)]
    if not keys:
        return False
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for impl in ("torch", "torch_spdl"):
            xs, ys, lo, hi = [], [], [], []
            for param, pair in _pairs(results, key).items():
                e = _errorbar(run_values(pair.get(impl), "rate"))
                if e is not None:
                    xs.append(param)
                    ys.append(e[0])
                    lo.append(e[1])
                    hi.append(e[2])
            if xs:
                ax.errorbar(
                    xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=impl, color=COLORS[impl]
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(_pairs(results, key)))
        ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{GROUPS[key].unit}/s (median, min-max)")
        ax.set_ylim(bottom=0)
        ax.set_title(GROUPS[key].title.split(": ", 1)[-1], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plot_bars(path: Path, results: list[Result], metric: str, ylabel: str) -> bool:
    import matplotlib.pyplot as plt

    keys = [
        k
        for k in GROUPS
        if k not in NAMED
        and any(
            run_values(p.get(i), metric) and spread(run_values(p.get(i), metric))
            for p in _pairs(results, k).values()
            for i in ("torch", "torch_spdl")
        )
    ]
    if not keys:
        return False
    fig, axes = plt.subplots(1, len(keys), figsize=(3.4 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        pairs = _pairs(results, key)
        for j, impl in enumerate(("torch", "torch_spdl")):
            for i, pair in enumerate(pairs.values()):
                e = _errorbar(run_values(pair.get(impl), metric))
                if e is None:
                    continue
                ax.bar(
                    i + (j - 0.5) * 0.4,
                    e[0],
                    0.4,
                    yerr=[[e[1]], [e[2]]],
                    capsize=2,
                    color=COLORS[impl],
                    label=impl if i == 0 else None,
                )
        ax.set_xticks(range(len(pairs)), [str(p) for p in pairs])
        ax.set_xlabel(GROUPS[key].param)
        ax.set_title(GROUPS[key].title.split(": ", 1)[-1].split(",")[0], fontsize=8, wrap=True)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- the report -----------------------------------------------------------------------------


def write_report(
    out: Path,
    results: list[Result],
    info: dict[str, str],
    *,
    quick: bool,
    repeats: int,
    elapsed_s: float,
) -> Path:
    """Write ``out/REPORT.md`` and its PNGs; return the Markdown file's path."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    md = _head(results, info, quick=quick, repeats=repeats, elapsed_s=elapsed_s)
    made = _draw_plots(out, results)
    md += _group_sections(results) + _sections_written_elsewhere(out)
    md += ["## Plots", ""]
    for name, title in made:
        md += [f"### {title}", "", f"![{title}]({name})", ""]
    md += _failed_runs(results)
    path = out / "REPORT.md"
    path.write_text("\n".join(md))
    return path


def _head(
    results: list[Result], info: dict[str, str], *, quick: bool, repeats: int, elapsed_s: float
) -> list[str]:
    """The report's opening: how it was made, the machine, how to read it, the summary."""
    mode = "quick (`--quick`)" if quick else "full"
    md = [
        "# torch_spdl benchmark report",
        "",
        f"Generated by `benchmarks/run.py` ({mode} mode) in {elapsed_s:.0f} s. Each figure "
        f"is the median of {repeats} runs with the min-max spread in brackets; every run is "
        "a fresh process forked from a server that has already imported torch (so neither "
        "side pays the import). The repeats are interleaved across configurations.",
        "",
        *disturbed_note(results),
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
        "## How to read it",
        "",
        "- **throughput**: samples (or items) per second over the timed section: the loader "
        "made, every batch read (one element of every 4 KiB page, as a training step reads "
        "all of a batch). It includes starting the workers, as each epoch of a loader "
        "without `persistent_workers` does.",
        "- **peak memory**: the peak of the summed PSS of the run's process and all its "
        "children (torch's worker processes), sampled every 50 ms in a run of its own (the "
        "sampler costs the run CPU, so the timed runs go without it); it includes the "
        "~300-400 MiB of an interpreter with torch imported, shared fairly between processes.",
        f"- **CPU**: CPU time of the process and its children in the timed section, divided "
        f"by wall time and the {CORES} cores (100% = every core busy).",
        "- **first batch**: loader made, `iter()`, first `next()`.",
        "- **ratio** is torch_spdl / torch of the throughput medians (above 1: torch_spdl "
        "faster). The verdict says *no clear difference* when the two spreads overlap. A "
        "configuration that failed or was not run says *not measured*; nothing is claimed "
        "for it.",
        "",
        "## Summary",
        "",
        *_summary(results),
        "",
    ]
    return md


def _draw_plots(out: Path, results: list[Result]) -> list[tuple[str, str]]:
    """Draw every plot that has data; return (file name, title) of those drawn."""
    plots = [
        (
            "throughput_vs_concurrency.png",
            "Throughput against concurrency",
            lambda p: _plot_lines(
                p,
                results,
                ["images-concurrency", "io-concurrency"],
                "concurrency (workers / io_concurrency)",
            ),
        ),
        (
            "throughput_vs_batch_size.png",
            "Throughput against batch size",
            lambda p: _plot_lines(p, results, ["images-batch", "decode"], "batch size"),
        ),
        (
            "peak_memory.png",
            "Peak memory of all processes",
            lambda p: _plot_bars(p, results, "peak", "peak PSS, MiB (all processes)"),
        ),
        (
            "cpu_utilisation.png",
            "CPU utilisation",
            lambda p: _plot_bars(p, results, "cpu", f"CPU, % of {CORES} cores"),
        ),
        (
            "time_to_first_batch.png",
            "Time to first batch",
            lambda p: _plot_bars(p, results, "first", "first batch, ms"),
        ),
        (
            "swap_ratios.png",
            "Swap the import: torch_spdl / torch per cell",
            lambda p: swap.plot(p, results),
        ),
        ("peers.png", "Side by side with the peers", lambda p: peers.plot(p, results)),
    ]
    return [(name, title) for name, title, draw in plots if draw(out / name)]


def _group_sections(results: list[Result]) -> list[str]:
    """One section per benchmark group that has results, with its table."""
    md: list[str] = []
    for key, g in GROUPS.items():
        if not any(r.spec.group == key for r in results):
            continue
        md += [f"## {g.title}", "", g.what, ""]
        if key == "engine":
            md += _engine_table(results)
        elif key == "swap":
            md += swap.tables(results)
        elif key == "peers":
            md += peers.tables(results)
        else:
            md += _paired_table(results, key)
        md.append("")
    return md


def _sections_written_elsewhere(out: Path) -> list[str]:
    """The sections other benchmarks wrote beside the report (their own servers, clusters)."""
    md: list[str] = []
    streaming = out / "streaming.md"  # written by benchmarks/streaming.py (its own server)
    if streaming.exists():
        md += ["## Streaming from object storage", "", streaming.read_text(), ""]
    ray = out / "ray_offload.md"  # written by benchmarks/ray_offload.py (its own cluster)
    if ray.exists():
        md += ["## Past one machine: the decoding on a Ray worker node", "", ray.read_text(), ""]
    return md


def _failed_runs(results: list[Result]) -> list[str]:
    """A section listing the runs that failed, if any did."""
    md: list[str] = []
    failed = [r for r in results if r.error]
    if failed:
        md += ["## Failed runs", ""]
        md += [
            f"- {r.spec.group} / {r.spec.impl} / {r.spec.param or r.spec.label}: {r.error}"
            for r in failed
        ]
        md.append("")
    return md
