"""The benchmark report: torch_spdl against torch's DataLoader, in one run.

    .venv/bin/python benchmarks/run.py --quick      # about 2 minutes on 2 quiet cores
    .venv/bin/python benchmarks/run.py              # the full sweep (about 11 minutes on 2 cores)

Runs the cases of ``engine.py``, ``dataloader.py`` and ``image_decode.py`` side by side with
torch's DataLoader, sweeping concurrency (1, 2, 4, 8) and batch size (32, 128, 512), and
``swap.py``'s cells (the same script with either DataLoader, the ``touch`` consumer; quick
mode: 2 workers only, smaller datasets, no thread rows) and ``peers.py``'s workloads
(SPDL, torchdata, PyAV, torchvision side by side), each
configuration ``--repeats`` times in a fresh process (see ``_measure.py`` for what is
measured and how), and writes ``REPORT.md`` with tables (median and min-max) and PNG plots
to ``--out`` (default ``benchmarks/report/``). A progress bar shows the runs.

On a busy machine: a run that other programs disturbed is run again (``--retries``), and
in quick mode the reruns may take at most a quarter of the time of the planned runs
(``--rerun-budget``; ``_reruns.py`` says why). The bar counts the reruns; when the budget
is spent, no run is run again, one line says so, and the report marks the figures that
keep disturbed runs.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the per-topic benchmarks and helpers beside this script

import image_decode  # noqa: E402
import peers  # noqa: E402
import swap  # noqa: E402
from _measure import QUICK_SHARE, RETRIES, Spec, machine, measure_all  # noqa: E402
from _report import GROUPS, write_report  # noqa: E402

CONCURRENCY = (1, 2, 4, 8)
BATCH_SIZES = (32, 128, 512)
IMPLS = ("torch", "torch_spdl")


def _kw(**kwargs: object) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(kwargs.items()))


def plan(quick: bool, jpeg_root: str, jpeg_count: int) -> list[Spec]:
    """Every configuration to measure, in the order they run."""
    specs: list[Spec] = []
    n_img = 1024 if quick else 4096
    for c in CONCURRENCY:
        for impl in IMPLS:
            kw = _kw(impl=impl, workers=c, batch=32, n=n_img, epochs=1, tuned=False)
            specs.append(Spec("images-concurrency", impl, c, "images", kw))
    for c in CONCURRENCY:
        n = (64 if quick else 200) * c  # 10 ms a sample: about 0.6 (2) s at full speed
        for impl in IMPLS:
            kw = _kw(impl=impl, concurrency=c, n=n, batch=16)
            specs.append(Spec("io-concurrency", impl, c, "sleep_io", kw))
    n_big = 2048 if quick else 8192
    for bs in BATCH_SIZES:
        for impl in IMPLS:
            kw = _kw(impl=impl, workers=2, batch=bs, n=n_big, epochs=2, tuned=True)
            specs.append(Spec("images-batch", impl, bs, "images", kw))
    for bs in (64,) if quick else BATCH_SIZES:
        for impl in IMPLS:
            kw = _kw(impl=impl, root=jpeg_root, batch=bs)
            specs.append(Spec("decode", impl, bs, "decode", kw))
    n_str = 200_000 if quick else 1_000_000
    for impl in IMPLS:
        specs.append(Spec("strings", impl, 4, "strings", _kw(impl=impl, n=n_str, workers=4)))
    engine_rows = [
        ("3 no-op sync stages, concurrency 4", 200_000, "torch_spdl"),
        ("3 no-op async stages", 300_000, "torch_spdl"),
        ("1 sync stage, sleep 10 ms, conc. 64", 20_000, "torch_spdl"),
        ("1 async stage, sleep 10 ms, conc. 512", 100_000, "torch_spdl"),
        ("torch DataLoader, 0 workers, batch 32", 1_000_000, "torch"),
        ("torch DataLoader, 2 workers, batch 32", 300_000, "torch"),
    ]
    for name, n, impl in engine_rows:
        n = n // 20 if quick else n // 4
        specs.append(Spec("engine", impl, 0, "engine_case", _kw(name=name, n=n), label=name))
    return specs + swap.plan(quick, jpeg_root, jpeg_count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (about 2 minutes)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure (3; 5 full)")
    parser.add_argument("--out", type=Path, default=HERE / "report", help="report folder")
    parser.add_argument("--only", default="", help="only the groups whose key contains this")
    parser.add_argument(
        "--retries",
        type=int,
        default=RETRIES,
        help=f"runs again of a timed run that other processes disturbed ({RETRIES}; 0 in CI)",
    )
    parser.add_argument(
        "--rerun-budget",
        type=float,
        default=None,
        help=f"time the reruns may take, a share of the planned runs' ({QUICK_SHARE} quick; "
        "no bound full)",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    budget = args.rerun_budget
    if budget is None:
        budget = QUICK_SHARE if args.quick else math.inf
    if not budget >= 0:
        parser.error(f"--rerun-budget must be 0 or more, got {budget}")
    if repeats < 1:
        parser.error(f"--repeats must be at least 1, got {repeats}")
    if args.retries < 0:
        parser.error(f"--retries must be 0 or more, got {args.retries}")
    unknown = args.only and not any(args.only in g for g in GROUPS)
    if unknown:
        parser.error(f"--only {args.only!r} matches no group; groups: {', '.join(GROUPS)}")

    info = machine()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="torch_spdl_bench_") as tmp:
        jpegs = 256 if args.quick else 1536
        image_decode.write_photo_folder(Path(tmp), jpegs)
        specs = [s for s in plan(args.quick, tmp, jpegs) if args.only in s.group]
        if args.only in "peers":  # its clips and JPEGs take a while to make: only if run
            (Path(tmp) / "peers").mkdir()
            data, _ = peers.prepare(Path(tmp) / "peers", args.quick)
            specs += peers.plan(args.quick, data)[0]
        results = measure_all(
            specs, repeats, fresh_memory=not args.quick, retries=args.retries, rerun_budget=budget
        )
    elapsed = time.perf_counter() - t0
    report = write_report(
        args.out,
        results,
        info,
        quick=args.quick,
        repeats=repeats,
        elapsed_s=elapsed,
    )
    print(f"wrote {report} and its plots in {elapsed:.0f} s")
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"failed: {r.spec.group} {r.spec.impl} {r.spec.param}: {r.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
