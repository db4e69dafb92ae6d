"""Who runs in the peers benchmark and on what: the contenders of each workload, the sizes,
and the plan of runs.

The list of contenders is what the cases, the tables and the plan all read (a table lists
its rows in this order, a case looks its contender up by name), so it sits below all three.
A contender names the peer module it needs; one that is not installed is left out of the
plan and named in a note, never run half-way.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from _results import Spec

GROUP = "peers"
CLIP = dict(width=320, height=240, seconds=10, fps=30, gop=30)
SAMPLED = 8  # frames per clip
SIDE = 112
BATCH = 32
# Our deep-queue rows: at queue_size=1024 and add_sink(1024) the 3 stages hold 4,110 items
# in flight with the consumer stopped, torchdata's prebatch=256 holds 6,400 (counted with
# an infinite source), so these compare at no more memory than torchdata's best.
DEEP = 1024

# workload -> (contender, peer module it needs or "", description)
CONTENDERS: dict[str, list[tuple[str, str, str]]] = {
    "video": [
        ("torch_spdl", "", "torch_spdl.io.load_video(indices=), sampled"),
        ("torch_spdl before", "", "decode every frame, scale, pick (the old load_video)"),
        ("spdl", "spdl", "spdl.io.demux_video + sample_decode_video"),
        ("pyav seek", "", "plain PyAV: seek to each frame's key frame, decode to it"),
    ],
    "jpeg": [
        ("torch_spdl", "", "pipeline + torch_spdl.io.decode_image"),
        ("torch_spdl + torchvision", "", "same engine, decode_jpeg + resize (default threads)"),
        ("torch_spdl + torchvision, 1 thread", "", "same, torch.set_num_threads(1)"),
        ("spdl", "spdl", "SPDL pipeline + spdl.io"),
        ("torchdata + PIL", "torchdata", "ParallelMapper(threads) + PIL"),
    ],
    "engine": [
        ("torch_spdl sync", "", "3 sync stages, concurrency 4"),
        ("torch_spdl async", "", "3 async stages"),
        ("torch_spdl sync, queue_size=1024", "", f"the same, {DEEP} items a queue and sink"),
        ("torch_spdl async, queue_size=1024", "", f"the same, {DEEP} items a queue and sink"),
        ("spdl sync", "spdl", "3 sync stages, concurrency 4"),
        ("spdl async", "spdl", "3 async stages"),
        *[
            (f"torchdata prebatch={p}", "torchdata", "3 ParallelMappers, 4 threads")
            for p in ("None", "16", "64", "256")
        ],
    ],
    "io": [
        ("torch_spdl sync", "", "sleep 10 ms, 32 threads"),
        ("torch_spdl async", "", "asyncio.sleep 10 ms, concurrency 32"),
        ("spdl sync", "spdl", "sleep 10 ms, concurrency 32"),
        ("spdl async", "spdl", "asyncio.sleep 10 ms, concurrency 32"),
        ("torchdata", "torchdata", "ParallelMapper(num_workers=32, threads)"),
    ],
}
UNITS = {"video": "clips", "jpeg": "images", "engine": "items", "io": "items"}


def installed(module: str) -> bool:
    return not module or importlib.util.find_spec(module) is not None


def sampled_indices() -> list[int]:
    n = CLIP["seconds"] * CLIP["fps"]
    return [round(k * (n - 1) / (SAMPLED - 1)) for k in range(SAMPLED)]


def plan(quick: bool, data: dict[str, Any], only: str = "") -> tuple[list[Spec], list[str]]:
    """The runs, and a line for each contender skipped because its peer is not installed."""
    specs, skipped = [], []
    sizes = {"engine": 40_000 if quick else 200_000, "io": 1_280 if quick else 6_400}
    for workload, contenders in CONTENDERS.items():
        if only and only != workload:
            continue
        for name, module, _ in contenders:
            if not installed(module):
                skipped.append(f"{workload}: {name} skipped ({module} is not installed)")
                continue
            kw: dict[str, Any] = {"workload": workload, "contender": name}
            if workload in ("engine", "io"):
                kw["n"] = sizes[workload]
            else:
                kw.update(data)
            specs.append(
                Spec(GROUP, name, 0, "peer_case", tuple(sorted(kw.items())), label=workload)
            )
    return specs, skipped
