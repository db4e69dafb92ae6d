"""torch's DataLoader against ``torch_spdl.DataLoader``, with the same number of workers.

Run: ``python benchmarks/dataloader.py [--repeats 3] [--quick] [--only TEXT]``. Each figure
is the median of ``--repeats`` runs, with the spread (min-max) beside it. This is a
benchmark, not a test: it prints a table and asserts nothing.

Cases:

1. latency-bound loading: every sample waits 10 ms on I/O (``time.sleep`` in torch's
   ``__getitem__``; an ``async`` or a sync ``load`` of a ``StagedDataset`` for torch_spdl).
2. large samples: 3x224x224 uint8 tensors (precomputed, 16 of them, returned by reference:
   cheap to make, heavy to move), batches of 32, 128 and 512. torch's workers collate each
   batch into shared memory and send it across processes; torch_spdl collates in threads.
3. trivial samples (ints), batch 32: the per-sample cost of the loader itself.
4. memory: a dataset holding 2M Python strings, 4 workers, one shuffled epoch of batch 256.
   Peak of the sum of PSS (``/proc/<pid>/smaps_rollup``; RSS where unavailable) over the
   loading process and all its children, sampled every 50 ms. Each run is a fresh process
   (one run each with ``--quick``: an epoch of 2M samples is long).
5. time to first batch with 8 workers (loader made, ``iter``, first ``next``), a dataset of
   small tensors; each run is a fresh process, so both pay a cold start.

``ratio`` is torch_spdl / torch: above 1 is better for rates, below 1 for memory and time.
The datasets are in ``_datasets.py`` (the report and the swap cells measure them too).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from _consumers import touch as _touch  # benchmarks/_consumers.py: the shared consumers
from _datasets import (  # benchmarks/_datasets.py: the datasets measured here and elsewhere
    AsyncSleepStaged,
    ImageDataset,
    IntDataset,
    SleepDataset,
    SmallTensorDataset,
    StringDataset,
    SyncSleepStaged,
)
from _measure import PeakMemory, pss_kb  # benchmarks/_measure.py, beside this script
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

import torch_spdl

__all__ = [  # the datasets, here for the scripts that import them from this benchmark
    "AsyncSleepStaged",
    "ImageDataset",
    "IntDataset",
    "SleepDataset",
    "SmallTensorDataset",
    "StringDataset",
    "SyncSleepStaged",
    "items_per_second",
    "main",
]

TORCH_WORKERS = 2  # the cores of the development machine; torch gets exactly these

# -- measuring ---------------------------------------------------------------------------


def items_per_second(loader: Iterable[Any], n: int) -> float:
    """Samples per second over one epoch of ``loader`` (``n`` samples), reading every page."""
    t0 = time.perf_counter()
    count = 0
    for batch in loader:
        _touch(batch)
        count += len(batch)
    elapsed = time.perf_counter() - t0
    if count != n:
        raise RuntimeError(f"the loader gave {count} samples, expected {n}")
    return n / elapsed


def _child(args: list[str], *, watch: bool = False) -> tuple[dict[str, Any], float]:
    """Run this script as a fresh process with ``--child ARGS``; its JSON result and, when
    ``watch``, the peak PSS (MiB) of its process tree."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = 0.0
    if watch:
        with PeakMemory(proc.pid) as mem:
            out, _ = proc.communicate()
        peak = mem.peak_kb / 1024
    else:
        out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak


# -- child processes: memory and time to first batch ---------------------------------------


def _memory_loader(kind: str, n: int) -> Any:
    dataset = StringDataset(n)
    cls = TorchDataLoader if kind == "torch" else torch_spdl.DataLoader
    return cls(dataset, batch_size=256, shuffle=True, num_workers=4)


def child_memory(kind: str, n: int) -> dict[str, Any]:
    loader = _memory_loader(kind, n)
    before = pss_kb(os.getpid()) / 1024  # this process, dataset built, no worker yet
    t0 = time.perf_counter()
    count = sum(len(b) for b in loader)
    return {"samples": count, "seconds": time.perf_counter() - t0, "before_mib": before}


def child_first_batch(kind: str) -> dict[str, Any]:
    dataset = SmallTensorDataset(100_000)
    t0 = time.perf_counter()
    cls = TorchDataLoader if kind == "torch" else torch_spdl.DataLoader
    loader = cls(dataset, batch_size=32, num_workers=8)
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - t0
    del it  # stops the workers
    return {"seconds": elapsed}


def run_child(argv: list[str]) -> None:
    what, kind, *rest = argv
    if what == "memory":
        result = child_memory(kind, int(rest[0]))
    elif what == "first-batch":
        result = child_first_batch(kind)
    else:
        raise SystemExit(f"unknown child {what!r}")
    print(json.dumps(result), flush=True)


# -- the cases -----------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    unit: str  # "/s", "MiB", "ms"
    torch: list[float]
    spdl: list[float]
    target: str
    check: Callable[[float, float], bool]  # (torch median, spdl median) -> met
    note: str = ""
    extra: list[str] = field(default_factory=list)


def _fmt(values: list[float], unit: str) -> str:
    med = statistics.median(values)
    if unit == "/s":
        if len(values) == 1:
            return f"{med:,.0f}/s"
        return f"{med:,.0f}/s ({min(values):,.0f}-{max(values):,.0f})"
    if len(values) == 1:
        return f"{med:,.0f} {unit}"
    return f"{med:,.0f} {unit} ({min(values):,.0f}-{max(values):,.0f})"


def _print_row(row: Row) -> None:
    t, s = statistics.median(row.torch), statistics.median(row.spdl)
    ratio = s / t if t else float("inf")
    met = "yes" if row.check(t, s) else "NO"
    print(
        f"| {row.case} | {_fmt(row.torch, row.unit)} | {_fmt(row.spdl, row.unit)} "
        f"| {ratio:.2f}x | {row.target} | {met} |",
        flush=True,
    )
    if row.note:
        print(f"|   ({row.note}) | | | | | |", flush=True)


def _times(repeats: int, fn: Callable[[], float]) -> list[float]:
    return [fn() for _ in range(repeats)]


def case_latency(repeats: int, quick: bool) -> list[Row]:
    n_torch = 320 if quick else 640  # ~200 samples/s: 1.6 or 3.2 s a run
    n_async = 20_000 if quick else 50_000
    n_sync = 5_000 if quick else 15_000

    def torch_run() -> float:
        loader = TorchDataLoader(SleepDataset(n_torch), batch_size=32, num_workers=TORCH_WORKERS)
        return items_per_second(loader, n_torch)

    def spdl_run(dataset: Dataset, n: int, io: int) -> float:
        loader = torch_spdl.DataLoader(
            dataset, batch_size=32, num_workers=TORCH_WORKERS, io_concurrency=io
        )
        return items_per_second(loader, n)

    torch_rates = _times(repeats, torch_run)
    async_rates = _times(repeats, lambda: spdl_run(AsyncSleepStaged(n_async), n_async, 512))
    sync_rates = _times(repeats, lambda: spdl_run(SyncSleepStaged(n_sync), n_sync, 128))
    return [
        Row(
            "10 ms I/O per sample, async load",
            "/s",
            torch_rates,
            async_rates,
            ">= 5,000/s",
            lambda t, s: s >= 5000,
            note="torch: num_workers=2, time.sleep in __getitem__; ours: num_workers=2, "
            "io_concurrency=512, async def load; batch 32",
        ),
        Row(
            "10 ms I/O per sample, sync load",
            "/s",
            torch_rates,
            sync_rates,
            ">= 5,000/s (limit 12,800/s)",
            lambda t, s: s >= 5000,
            note="ours: num_workers=2, io_concurrency=128, time.sleep in load; batch 32",
        ),
    ]


LARGE_KNOBS = {"num_workers": 1, "collate_concurrency": 2, "buffer_size": 4}


def case_large(repeats: int, quick: bool) -> list[Row]:
    """One loader each, timed over ``repeats`` epochs, as a training run uses it: ours
    allocates its recycled batch buffers in the first epoch and reuses them after."""
    rows = []
    n = 4096 if quick else 12_288  # 3x224x224 uint8: 147 KiB a sample
    for bs in (32, 128, 512):
        torch_loader = TorchDataLoader(ImageDataset(n), batch_size=bs, num_workers=TORCH_WORKERS)
        spdl_loader = torch_spdl.DataLoader(ImageDataset(n), batch_size=bs, **LARGE_KNOBS)
        rows.append(
            Row(
                f"3x224x224 uint8, batch {bs}",
                "/s",
                _times(repeats, functools.partial(items_per_second, torch_loader, n)),
                _times(repeats, functools.partial(items_per_second, spdl_loader, n)),
                ">= 2.00x",
                lambda t, s: s >= 2 * t,
            )
        )
    knobs = ", ".join(f"{k}={v}" for k, v in LARGE_KNOBS.items())
    rows[-1].note = (
        f"torch: num_workers=2; ours: {knobs}; {n} samples an epoch; one loader each, "
        f"median over {repeats} epochs"
    )
    return rows


def case_trivial(repeats: int, quick: bool) -> list[Row]:
    n = 64_000 if quick else 192_000

    def torch_run() -> float:
        return items_per_second(
            TorchDataLoader(IntDataset(n), batch_size=32, num_workers=TORCH_WORKERS), n
        )

    def spdl_run(workers: int) -> float:
        return items_per_second(
            torch_spdl.DataLoader(IntDataset(n), batch_size=32, num_workers=workers), n
        )

    torch_rates = _times(repeats, torch_run)
    ours = {w: _times(repeats, lambda w=w: spdl_run(w)) for w in (0, 1, 2)}
    best = max(ours, key=lambda w: statistics.median(ours[w]))
    tried = ", ".join(f"{w}: {statistics.median(r):,.0f}/s" for w, r in ours.items())
    return [
        Row(
            "ints, batch 32 (best num_workers)",
            "/s",
            torch_rates,
            ours[best],
            ">= 1.00x",
            lambda t, s: s >= t,
            note=f"torch: num_workers=2; ours best num_workers={best}; tried {tried}",
        )
    ]


def case_memory(repeats: int, quick: bool) -> list[Row]:
    n = 2_000_000
    runs = 1 if quick else repeats  # an epoch of ours takes about a minute here
    peaks: dict[str, list[float]] = {"torch": [], "spdl": []}
    secs: dict[str, list[float]] = {"torch": [], "spdl": []}
    before: dict[str, list[float]] = {"torch": [], "spdl": []}
    for _ in range(runs):
        for kind in ("torch", "spdl"):
            result, peak = _child(["memory", kind, str(n)], watch=True)
            peaks[kind].append(peak)
            secs[kind].append(result["seconds"])
            before[kind].append(result["before_mib"])

    def above(kind: str) -> float:
        return statistics.median(peaks[kind]) - statistics.median(before[kind])

    note = (
        f"2M strings, 4 workers, batch 256, shuffle, {runs} run(s); the process with its "
        f"dataset, before iterating: {statistics.median(before['torch']):,.0f} MiB (torch), "
        f"{statistics.median(before['spdl']):,.0f} MiB (ours); peak above that: "
        f"torch +{above('torch'):,.0f} MiB, ours +{above('spdl'):,.0f} MiB; epoch "
        f"{statistics.median(secs['torch']):.1f} s (torch) vs "
        f"{statistics.median(secs['spdl']):.1f} s (ours)"
    )
    return [
        Row(
            "peak memory, 2M strings, 4 workers",
            "MiB",
            peaks["torch"],
            peaks["spdl"],
            "<= 0.50x",
            lambda t, s: s <= t / 2,
            note=note,
        )
    ]


def case_first_batch(repeats: int, quick: bool) -> list[Row]:
    torch_ms, spdl_ms = [], []
    for _ in range(repeats):
        torch_ms.append(_child(["first-batch", "torch"])[0]["seconds"] * 1000)
        spdl_ms.append(_child(["first-batch", "spdl"])[0]["seconds"] * 1000)
    return [
        Row(
            "time to first batch, 8 workers",
            "ms",
            torch_ms,
            spdl_ms,
            "<= 0.50x",
            lambda t, s: s <= t / 2,
            note="small tensors, batch 32; loader made + iter + next, in a fresh process",
        )
    ]


CASES: list[tuple[str, Callable[[int, bool], list[Row]]]] = [
    ("latency", case_latency),
    ("large", case_large),
    ("trivial", case_trivial),
    ("memory", case_memory),
    ("first-batch", case_first_batch),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer samples per run")
    parser.add_argument("--only", default="", help="run only cases whose key contains this")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # torch's advice to use at most os.cpu_count() worker processes; the cases ask for more.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    if args.child:
        run_child(args.child)
        return
    print(
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.machine()}; "
        f"median of {args.repeats} runs (min-max); torch workers: {TORCH_WORKERS}",
        flush=True,
    )
    print("| case | torch | torch_spdl | ratio | target | met? |")
    print("| --- | ---: | ---: | ---: | --- | --- |", flush=True)
    t0 = time.perf_counter()
    for key, fn in CASES:
        if args.only and args.only not in key:
            continue
        for row in fn(args.repeats, args.quick):
            _print_row(row)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
