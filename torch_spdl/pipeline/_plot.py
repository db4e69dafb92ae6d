"""``plot_trace``: one PNG of a traced run, to see the bottleneck at a glance.

Top: items/s out of each stage over time (from the spans). Middle: how full each queue
was (depth / capacity): a stage whose input queue stays full and whose output queue stays
empty is the bottleneck. Bottom, when a stage was autotuned: its concurrency over time.
matplotlib is imported here only and draws on a bare ``Figure`` (the Agg renderer), so it
needs no display and leaves pyplot's backend alone.
"""

from __future__ import annotations

import os
from typing import Any

from ._trace import PipelineTrace, as_trace

__all__ = ["plot_trace"]


def _bins(end: float, bin_seconds: float | None) -> float:
    if bin_seconds is not None:
        if bin_seconds <= 0:
            raise ValueError(f"bin_seconds must be positive, got {bin_seconds!r}")
        return bin_seconds
    return max(end / 100, 0.01)  # about 100 bins over the run


def plot_trace(
    trace: PipelineTrace | Any, path: str | os.PathLike[str], *, bin_seconds: float | None = None
) -> None:
    """Write a PNG of per-stage throughput and queue occupancy over time to ``path``.

    ``trace`` is a :class:`PipelineTrace` or a traced ``Pipeline``; ``bin_seconds`` is the
    width of a throughput bin (default: a hundredth of the run, at least 10 ms).
    """
    try:  # a bare Figure renders with Agg and leaves pyplot's backend alone
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib is optional for the library
        raise ImportError("plot_trace needs matplotlib: pip install matplotlib") from exc

    data = as_trace(trace)
    end = max(
        [s.end for s in data.spans] + [s.time for s in data.samples] + [1e-3],
    )
    width = _bins(end, bin_seconds)
    nbins = int(end / width) + 1
    tuned = [
        i for i in range(len(data.stages)) if len({s.concurrency[i] for s in data.samples}) > 1
    ]
    rows = 3 if tuned else 2
    fig = Figure(figsize=(10, 2.8 * rows), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]

    counts = {stage: [0] * nbins for stage in data.stages}
    for span in data.spans:
        counts[span.stage][min(int(span.end / width), nbins - 1)] += 1
    ax = axes[0]
    for stage in data.stages:
        ax.plot(
            [(i + 0.5) * width for i in range(nbins)],
            [c / width for c in counts[stage]],
            label=stage,
        )
    ax.set_ylabel("items/s out")
    ax.set_title("throughput per stage")
    ax.legend(fontsize="small", loc="upper right")

    ax = axes[1]
    times = [s.time for s in data.samples]
    for q, (name, capacity) in enumerate(data.queues):
        depths = [s.queue_depths[q] for s in data.samples]
        if capacity:
            ax.plot(times, [d / capacity for d in depths], label=name)
        else:
            peak = max(depths, default=0) or 1
            ax.plot(times, [d / peak for d in depths], label=f"{name} (unbounded, / max)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("depth / capacity")
    ax.set_title("queue occupancy (full input + empty output = bottleneck)")
    ax.legend(fontsize="small", loc="upper right")

    if tuned:
        ax = axes[2]
        for i in tuned:
            ax.step(
                times, [s.concurrency[i] for s in data.samples], where="post", label=data.stages[i]
            )
        ax.set_ylabel("workers")
        ax.set_title("concurrency of autotuned stages")
        ax.legend(fontsize="small", loc="upper left")
    axes[-1].set_xlabel("seconds since start")
    fig.savefig(os.fspath(path), dpi=100)
