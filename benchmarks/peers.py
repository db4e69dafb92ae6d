"""Side by side with the peers: torch_spdl against SPDL, torchdata and plain PyAV/torchvision.

    pip install -e '.[peers]'                 # spdl==0.8.0, torchdata==0.11.0
    .venv/bin/python benchmarks/peers.py --quick        # CI-sized, about 2 minutes
    .venv/bin/python benchmarks/peers.py                # 5 rounds, about 10 minutes on 2 cores
    .venv/bin/python benchmarks/peers.py --only video   # one workload

Workloads (each contender run in a fresh process, contenders alternated round by round,
medians with the min-max spread, CPU per item of the process tree and its peak PSS; see
``_measure.py``):

- ``video``: 20 H.264 clips (320x240, 10 s, 30 fps, GOP 30, x264's default B-frames),
  8 evenly spaced frames of each resized to 112x112, clips one after another on one thread:
  ``torch_spdl.io.load_video(indices=)`` (sampled decoding), the same call as it was
  before (every frame decoded and scaled, then picked: ``decode_packets`` + pick),
  ``spdl.io.sample_decode_video``, and a plain PyAV loop that seeks before each frame.
- ``jpeg``: 2,000 photo-like 500x375 JPEG files -> 224x224 batches of 32, decoding on 2
  threads: a torch_spdl pipeline with ``torch_spdl.io`` (``benchmarks/image_decode.py``'s
  epoch), the same engine with torchvision's ``decode_jpeg`` + ``resize`` as a user would
  write it (torch's default intra-op threads, and ``torch.set_num_threads(1)``), SPDL's
  pipeline with ``spdl.io``, and torchdata's ``ParallelMapper`` with PIL.
- ``engine``: 3 no-op stages over 200k ints, sync (concurrency 4) and async:
  torch_spdl (``benchmarks/engine.py``'s cases), torchdata ``ParallelMapper`` (4 threads
  per stage) with ``prebatch`` None, 16, 64 and 256, and SPDL.
- ``io``: one stage that waits 10 ms per item, concurrency 32 (limit: 3,200 items/s).

A peer that is not installed is skipped, and the table says so. The table ends with the
issue's targets, each marked met or not met on the medians.

**spdl_io's FFmpeg.** ``spdl.io`` (SPDL's native decoder, ``spdl_io``) loads FFmpeg's
shared libraries at run time: ``libavutil``, ``libavcodec``, ``libavformat``,
``libavdevice`` and ``libavfilter`` of FFmpeg 4 to 8 (sonames ``libavutil.so.56`` to
``.60``, ``libavcodec.so.58`` to ``.62``, ``libavformat.so.58`` to ``.62``,
``libavdevice.so.58`` to ``.62``, ``libavfilter.so.7`` to ``.11``), found through the
loader's path (``apt install ffmpeg`` or ``libavformat-dev libavdevice-dev
libavfilter-dev`` on Debian/Ubuntu). When they are not there, this script points spdl_io at
the FFmpeg 8 libraries inside PyAV's wheel (``av.libs``): links under their sonames in a
temporary folder, on ``LD_LIBRARY_PATH`` of the benchmark's own forkserver. Both decoders
then run the same FFmpeg build, which makes the video comparison like for like.

Where the pieces are: the contenders and the plan in ``_peer_plan.py``, the clips, JPEGs
and FFmpeg links in ``_peer_data.py``, what each contender runs in ``_peer_cases.py``, the
tables, targets and plot in ``_peer_tables.py``. This file is the command line, and the
names ``run.py``, ``_cases.py`` and the report use (``prepare``, ``plan``, ``case``,
``tables``, ``targets``, ``plot``), so that they import one benchmark, not its parts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _peer_cases import case  # noqa: E402
from _peer_data import prepare  # noqa: E402
from _peer_plan import CONTENDERS, GROUP, installed, plan  # noqa: E402
from _peer_tables import plot, tables, targets  # noqa: E402

__all__ = [
    "CONTENDERS",
    "GROUP",
    "case",
    "installed",
    "main",
    "plan",
    "plot",
    "prepare",
    "tables",
    "targets",
]


def main(argv: list[str] | None = None) -> int:
    from _measure import machine, measure_all

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized runs (3 rounds)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (3 quick, 5 full)")
    parser.add_argument("--only", default="", choices=["", *CONTENDERS], help="one workload")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    info = machine()
    print(", ".join(f"{k}: {v}" for k, v in info.items()))
    with tempfile.TemporaryDirectory(prefix="torch_spdl_peers_") as tmp:
        data, notes = prepare(Path(tmp), args.quick)
        specs, skipped = plan(args.quick, data, args.only)
        results = measure_all(specs, repeats, desc="peer runs", fresh_memory=not args.quick)
    raw = [
        [r.spec.label, r.spec.impl, [vars(s) for s in (*r.memory_runs, *r.runs)], r.error]
        for r in results
    ]
    print("raw:", json.dumps(raw), flush=True)  # the figures, whatever the tables make of them
    print(f"\n{'quick' if args.quick else 'full'} mode, median (min-max) of {repeats} rounds")
    for note in notes:
        print(f"- {note}")
    print("\n".join(tables(results, skipped)))
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        plot(args.plot, results)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
