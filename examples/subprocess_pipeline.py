"""Run a whole pipeline in a child process and read its batches in this one.

    .venv/bin/python examples/subprocess_pipeline.py --quick

Why: a pipeline whose Python work holds the GIL competes with the training loop for it.
Moved into its own process, it has an interpreter of its own and sends finished batches
back over a pipe. Two ways are shown:

- ``run_pipeline_in_subprocess(builder)``: the *declaration* is pickled to the child (spawn
  start method), built and run there;
- ``iterate_in_subprocess(fn)``: any picklable function returning an iterable (here one
  that builds the pipeline itself, so its source can be made in the child).

The ops are module-level functions so that they can be pickled. The example checks its
own result: every sample came back once, computed correctly, in a process other than
this one; it exits non-zero if not.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Iterator

import torch

from torch_spdl.pipeline import PipelineBuilder, iterate_in_subprocess, run_pipeline_in_subprocess


def make_sample(i: int) -> tuple[int, torch.Tensor]:
    """A CPU stage: a small image-like tensor whose values depend on ``i``."""
    return i, torch.full((3, 32, 32), float(i)).sqrt_()


def collate(samples: list[tuple[int, torch.Tensor]]) -> dict[str, object]:
    return {
        "index": torch.tensor([i for i, _ in samples]),
        "image": torch.stack([x for _, x in samples]),
        "pid": os.getpid(),  # which process made the batch
    }


def builder(n: int, batch_size: int) -> PipelineBuilder:
    return (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(make_sample, concurrency=2, output_order="input")
        .aggregate(batch_size)
        .pipe(collate)
        .add_sink(4)
    )


def batches_in_child(n: int, batch_size: int) -> Iterator[dict[str, object]]:
    """For ``iterate_in_subprocess``: build and run the pipeline where this is called."""
    pipeline = builder(n, batch_size).build()
    with pipeline.auto_stop():
        yield from pipeline


def check(batches: list[dict[str, object]], n: int, batch_size: int) -> list[str]:
    problems = []
    indices = torch.cat([b["index"] for b in batches])  # type: ignore[misc]
    if sorted(indices.tolist()) != list(range(n)):
        problems.append(f"got {len(indices)} samples, not each of 0..{n - 1} once")
    for b in batches:
        image, index = b["image"], b["index"]
        assert isinstance(image, torch.Tensor) and isinstance(index, torch.Tensor)
        want = index.float().sqrt()[:, None, None, None].expand_as(image)
        if image.shape[1:] != (3, 32, 32) or not torch.allclose(image, want):
            problems.append(f"batch starting at {int(index[0])}: wrong values")
        if b["pid"] == os.getpid():
            problems.append("a batch was made in this process, not in the subprocess")
    if any(len(b["index"]) > batch_size for b in batches):  # type: ignore[arg-type]
        problems.append("a batch is larger than the batch size")
    return problems


def run(label: str, it: Iterator[dict[str, object]], n: int, batch: int) -> list[str]:
    t0 = time.perf_counter()
    batches = list(it)
    elapsed = time.perf_counter() - t0
    pids = sorted({b["pid"] for b in batches})  # type: ignore[type-var]
    print(
        f"{label}: {len(batches)} batches, {n / elapsed:,.0f} samples/s including the "
        f"child's start ({elapsed:.2f} s); made in pid {pids}, read in pid {os.getpid()}"
    )
    return check(batches, n, batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    n = args.samples or (2_000 if args.quick else 50_000)
    bs = args.batch_size

    problems = run("run_pipeline_in_subprocess", run_pipeline_in_subprocess(builder(n, bs)), n, bs)
    problems += run(
        "iterate_in_subprocess     ",
        iterate_in_subprocess(functools.partial(batches_in_child, n, bs), buffer_size=4),
        n,
        bs,
    )
    for p in problems[:10]:
        print("FAILED:", p)
    if problems:
        return 1
    print("every sample came back once, computed in the subprocess: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
