"""Swap the import: one training-loop script, run with torch's DataLoader and with ours.

Run: ``python benchmarks/swap.py [--quick] [--repeats N] [--only TEXT] [--workers N]
[--peaks]``. Prints Markdown tables; asserts nothing. ``benchmarks/run.py`` runs the same
cells for its report.

Why: ``torch_spdl.DataLoader`` claims to be a drop-in for ``torch.utils.data.DataLoader``.
The other benchmarks give each side its best knobs; this one changes *only the import*.
``train_loop`` (in ``_swap_cells.py``) is written once and receives the DataLoader class
(torch's, or ``from torch_spdl import DataLoader``); it passes ``dataset, batch_size,
num_workers`` (and ``shuffle=True`` where a training run would) and nothing else, so every
other argument is each side's default. A user who swaps the import gets exactly these numbers.

Workloads (cells), each at ``num_workers`` 2 and 4:

1. ``sleep-io``: 10 ms of blocking I/O per sample (``time.sleep``), batch 16;
2. ``jpeg``: JPEG files through torchvision's ``ImageFolder`` with PIL ``Resize`` +
   ``PILToTensor``, batch 64;
3. ``tokenizer``: a pure-Python WordPiece-style tokenizer over synthetic text, batch 32;
4. ``numpy``: a dozen small numpy ops on a 64x64 float32 crop per sample, batch 64;
5. ``images``: 3x224x224 uint8 tensors, batch 128;
6. ``ints``: trivial ints, batch 32;
7. ``paths``: 2M path strings held in the dataset, shuffled, batch 256 (1,000 batches, 300
   quick: a whole epoch takes too long).

Extra rows of ours: ``torch_spdl-staged`` (``sleep-io``: the dataset split as ``torch-spdl
migrate`` splits a read, the 10 ms wait in a ``load`` stage on I/O threads, the rest in the
worker processes) and ``torch_spdl-thread`` (``jpeg``, ``tokenizer``: ``worker_type="thread"``,
which gives up torch's RNG contract, docs/dataloader.md). Each run is a fresh process
(``_measure.Runner``: peak summed PSS of the process tree, CPU of the tree); the repeats
alternate which side goes first. A run stops after the batch that passes 8 s (3 s quick): a
pathologically slow configuration still gets a rate without eating the budget.

A data loader is judged inside a training script, so every cell runs with three consumers
(``--consumers``), defined in ``_consumers.py`` (shared with ``streaming.py``):

- ``touch``: reads one element of every 4 KiB page of each tensor batch, as a training step
  reads all of it, and nothing else (the loader alone);
- ``train``: a small CNN's forward, backward and SGD step per batch on a 32x3x64x64 input
  (the batch's own when it is such an image batch), at torch's default intra-op threads:
  the training loop needs the cores, the GIL and the allocator too;
- ``gpu``: what a GPU step costs the host: 2 ms of Python holding the GIL (the kernel
  launches), then 8 ms waiting without it (the synchronisation).

The verdict of a row is on the medians of the two sides; the column "side by side" also
compares the runs in the pairs that ran next to each other (the median of the pair ratios,
and in how many pairs ours was at least as fast): on this shared machine a cell's runs move
by 20% over a table's hour, which pairs share and medians do not.

Quick mode: ``num_workers=2`` only, smaller datasets, 3 repeats, the ``touch`` consumer
only, no thread rows. Sized so that the slower side takes about 1-3 s a run in full mode.

Where the pieces are: the cells and the loop in ``_swap_cells.py`` (the datasets only this
benchmark uses in ``_swap_datasets.py``), the tables in ``_swap_tables.py``, the plot in
``_swap_plot.py``. This file is the command line, and the names ``run.py``, ``_cases.py``
and the report use (``plan``, ``run_cell``, ``rows``, ``tables``, ``plot``), so that they
import one benchmark, not its parts.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

from _consumers import CONSUMERS
from _measure import machine, measure_all
from _swap_cells import CELL, CELLS, plan, run_cell, train_loop, worker_counts
from _swap_plot import plot
from _swap_tables import memory_status, peak_listing, report_text, rows, tables

__all__ = [
    "CELL",
    "CELLS",
    "main",
    "memory_status",
    "peak_listing",
    "plan",
    "plot",
    "report_text",
    "rows",
    "run_cell",
    "tables",
    "train_loop",
]


def _parser() -> argparse.ArgumentParser:
    """The command line (the module's docstring says what it runs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 workers only, smaller runs")
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure (3; 5 full)")
    parser.add_argument("--only", default="", help="only the cells whose key contains this")
    parser.add_argument("--workers", type=int, default=0, help="only this num_workers (2 or 4)")
    parser.add_argument(
        "--peaks", action="store_true", help="also list what each memory run's peak was made of"
    )
    parser.add_argument(
        "--consumers",
        default=None,
        help=f"comma-separated, of {', '.join(CONSUMERS)} (all; touch quick)",
    )
    parser.add_argument(
        "--sample-ms", type=float, default=50.0, help="PSS sampling interval (50, as run.py)"
    )
    parser.add_argument(
        "--memory-runs",
        type=int,
        default=None,
        help="sampled runs per figure for peak memory (3; 1 quick)",
    )
    parser.add_argument("--save", default="", help="also pickle the header and results here")
    parser.add_argument("--render", default="", help="print the tables of a --save file only")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, "rb") as f:
            header, results = pickle.load(f)
        print(header)
        print(report_text(results, args.peaks))
        return 0
    repeats = args.repeats or (3 if args.quick else 5)
    # A training process's peak memory is bimodal run to run (a full collection after the
    # workers fork copies every page of objects they share): one run decides nothing.
    memory_runs = args.memory_runs or (1 if args.quick else 3)
    consumers = tuple(
        (args.consumers or ("touch" if args.quick else ",".join(CONSUMERS))).split(",")
    )
    if not set(consumers) <= set(CONSUMERS):
        parser.error(f"--consumers: each of {', '.join(CONSUMERS)}")
    if not any(args.only in c.key for c in CELLS):
        parser.error(f"--only {args.only!r} matches no cell: {', '.join(CELL)}")
    if not worker_counts(args.quick, args.workers):
        parser.error(f"--workers: one of {worker_counts(args.quick)}")
    from image_decode import write_photo_folder

    info = machine()
    t0 = time.perf_counter()
    count = 256 if args.quick else 1536
    with tempfile.TemporaryDirectory(prefix="torch_spdl_swap_") as tmp:
        write_photo_folder(Path(tmp), count)
        specs = plan(args.quick, tmp, count, args.only, consumers, args.workers)
        results = measure_all(
            specs,
            repeats,
            "swap runs",
            args.sample_ms / 1000,
            memory_runs=memory_runs,
            fresh_memory=not args.quick,
        )
    header = (
        f"torch_spdl {info['torch_spdl']}, torch {info['torch']}, {info['cores']} cores, "
        f"{info['CPU']}; load average at start {info['load average at start']}; median of "
        f"{repeats} timed runs (min-max), fresh process each; peak memory from {memory_runs} "
        f"more run(s) each{'' if args.quick else ' in a fresh interpreter'}, "
        f"PSS sampled every {args.sample_ms:g} ms; timed runs that other processes disturbed "
        f"dropped and run again: {sum(r.dropped for r in results)}; "
        f"{time.perf_counter() - t0:.0f} s\n"
    )
    if args.save:
        with open(args.save, "wb") as f:
            pickle.dump((header, results), f)
    print(header)
    print(report_text(results, args.peaks))
    for r in results:
        if r.error:
            print(f"failed: {r.spec.label} {r.spec.impl} {r.spec.param}: {r.error}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
