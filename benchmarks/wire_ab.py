"""The per-batch cost of the process wire, two checkouts side by side: trivial ints through
``torch_spdl.DataLoader`` with 2 worker processes.

Run: ``python benchmarks/wire_ab.py BEFORE_CHECKOUT [AFTER_CHECKOUT] [--rounds 7] [--n 320000]``
(AFTER defaults to this checkout; ``git worktree add --detach /tmp/before REV`` makes one).
Prints a Markdown table; asserts nothing.

Why: with items that cost nothing to load (swap.py's trivial-ints cell), a batch's cost is
the wire's: the messages a batch sends, their pickling, the arena's bookkeeping, all on the
training process's main thread. That cost is small against noise between runs, so the two
checkouts run alternately (each run a fresh process, the order the same every round), the
start-up excluded (the clock starts at the first batch), and the main thread's CPU a batch
(``time.thread_time``) is printed beside the throughput; one more run a side under
cProfile counts the Python calls a batch.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve()


def one_run(n: int, profile: bool) -> dict[str, float]:
    """One epoch in this process, timed from its first batch; the figures as a dict."""
    from _datasets import IntDataset  # benchmarks/_datasets.py, on the child's path

    from torch_spdl import DataLoader

    it = iter(DataLoader(IntDataset(n), batch_size=32, num_workers=2))
    next(it)
    prof = cProfile.Profile() if profile else None
    t0, c0, batches = time.perf_counter(), time.thread_time(), 0
    if prof:
        prof.enable()
    for _ in it:
        batches += 1
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    out = {"samples_per_s": batches * 32 / wall, "cpu_us": cpu / batches * 1e6}
    if prof:
        out["calls"] = pstats.Stats(prof).total_calls / batches  # type: ignore[attr-defined]
    return out


def _spawn(checkout: Path, n: int, profile: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{checkout}{os.pathsep}{_HERE.parent}")
    cmd = [sys.executable, str(_HERE), "--one", str(n)] + (["--profile"] if profile else [])
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def _cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, nargs="?", help="the checkout to compare against")
    parser.add_argument("after", type=Path, nargs="?", default=_HERE.parent.parent)
    parser.add_argument("--rounds", type=int, default=7, help="alternated runs a side (7)")
    parser.add_argument("--n", type=int, default=320_000, help="ints an epoch (320,000)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:  # a child: one run of the checkout on its path
        print(json.dumps(one_run(args.one, args.profile)))
        return 0
    if args.before is None:
        parser.error("name the checkout to compare against")
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for name, checkout in sides.items():
            runs[name].append(_spawn(checkout, args.n, profile=False))
    calls = {name: _spawn(c, args.n, profile=True)["calls"] for name, c in sides.items()}
    print(f"{args.n:,} ints, batches of 32, 2 workers, {args.rounds} alternated rounds\n")
    print(
        "| checkout | samples/s, median (min-max) | main thread CPU a batch, us | calls a batch |"
    )
    print("| --- | ---: | ---: | ---: |")
    for name, checkout in sides.items():
        rates, cpus = [r["samples_per_s"] for r in runs[name]], [r["cpu_us"] for r in runs[name]]
        print(
            f"| {name}, {checkout} | {_cell(rates, ',.0f')} | {_cell(cpus, '.1f')} | "
            f"{calls[name]:.1f} |"
        )
    paired = [
        a["samples_per_s"] / b["samples_per_s"]
        for a, b in zip(runs["after"], runs["before"], strict=True)
    ]
    print(f"\npaired rounds, after / before: median {statistics.median(paired):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
