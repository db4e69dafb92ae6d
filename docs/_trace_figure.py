"""Regenerate docs/_static/autotune_trace.png: the traced, autotuned run of docs/autotune.md.

Run: ``python docs/_trace_figure.py``. Prints the tuner's decisions.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from torch_spdl.pipeline import PipelineBuilder

BUF = bytes(512 * 1024)


def download(x: int) -> int:
    time.sleep(0.005)  # fixed latency: holds no CPU and no GIL
    return x


def decode(x: int) -> int:
    hashlib.sha256(BUF).digest()  # fixed CPU work that releases the GIL
    return x


def collate(x: int) -> int:
    return x


def main() -> None:
    pipeline = (
        PipelineBuilder()
        .add_source(range(6000))
        .pipe(download, concurrency="auto")
        .pipe(decode, concurrency="auto", max_concurrency=8)
        .pipe(collate, name="serial")
        .add_sink(16)
        .build(trace=True, cpu_budget=1.0)
    )
    with pipeline.auto_stop():
        for _ in pipeline:
            pass
    for line in pipeline.format_stats().splitlines():
        print(line)
    out = Path(__file__).parent / "_static" / "autotune_trace.png"
    pipeline.plot_trace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
