"""Engine throughput: items/s through no-op and sleeping stages, against torch's DataLoader.

Run: ``python benchmarks/engine.py [--repeats 3] [--quick]``. Each figure is the median of
``--repeats`` runs; the spread (min-max) is printed beside it. This is a benchmark, not a
test: it prints figures and asserts nothing.

The items here are ints, so every row uses ``add_sink(SINK)`` with ``SINK = 64``: with tiny
items a sink of 3 (SPDL's default, and ours) costs a thread switch every 3 items under the
GIL; the last row shows that case for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from collections.abc import Callable

from torch_spdl.pipeline import PipelineBuilder, TaskStatsHook

SINK = 64


def noop(x: int) -> int:
    return x


async def anoop(x: int) -> int:
    return x


def sleep_10ms(x: int) -> int:
    time.sleep(0.01)
    return x


async def asleep_10ms(x: int) -> int:
    await asyncio.sleep(0.01)
    return x


def _stats_hooks(info):  # noqa: ANN001, ANN202
    return [TaskStatsHook(info)]


def _run(builder: PipelineBuilder, n: int, *, trace: bool = False, hooks: bool = False) -> float:
    """Items/s through the pipeline; with ``trace``, also check one span per item per stage;
    with ``hooks``, every stage runs a ``TaskStatsHook``."""
    pipeline = builder.build(trace=trace, task_hook_factory=_stats_hooks if hooks else None)
    t0 = time.perf_counter()
    count = 0
    with pipeline.auto_stop():
        for _ in pipeline:
            count += 1
    elapsed = time.perf_counter() - t0
    assert count == n, (count, n)
    if trace:
        assert len(pipeline.trace().spans) == n * len(builder.get_config().stages)
    return n / elapsed


def sync_stages(n: int, *, trace: bool = False) -> float:
    b = PipelineBuilder().add_source(range(n))
    for _ in range(3):
        b.pipe(noop, concurrency=4)
    return _run(b.add_sink(SINK), n, trace=trace)


def async_stages(n: int, *, hooks: bool = False) -> float:
    b = PipelineBuilder().add_source(range(n))
    for _ in range(3):
        b.pipe(anoop)
    return _run(b.add_sink(SINK), n, hooks=hooks)


def sync_stages_hooked(n: int) -> float:
    b = PipelineBuilder().add_source(range(n))
    for _ in range(3):
        b.pipe(noop, concurrency=4)
    return _run(b.add_sink(SINK), n, hooks=True)


def source_to_sink(n: int, sink: int | None = None) -> float:
    return _run(PipelineBuilder().add_source(range(n)).add_sink(sink or SINK), n)


def sync_sleep(n: int) -> float:
    return _run(
        PipelineBuilder().add_source(range(n)).pipe(sleep_10ms, concurrency=64).add_sink(SINK), n
    )


def async_sleep(n: int) -> float:
    b = PipelineBuilder().add_source(range(n)).pipe(asleep_10ms, concurrency=512).add_sink(SINK)
    return _run(b, n)


def _gil(x: int) -> int:
    """A GIL-bound op: about 0.1-0.2 ms of pure Python arithmetic."""
    total = 0
    for i in range(2000):
        total += i * i
    return x + total % 2


REGION_WORKERS = 2


def region(n: int) -> float:
    """Two GIL-bound stages fused into one to() region of REGION_WORKERS processes."""
    from torch_spdl.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

    b = (
        PipelineBuilder()
        .add_source(range(n))
        .to(ProcessPoolExecutorConfig(max_workers=REGION_WORKERS))
        .pipe(_gil)
        .pipe(_gil)
        .to(MAIN_PROCESS)
        .add_sink(SINK)
    )
    return _run(b, n)


def per_item_processes(n: int) -> float:
    """The same two stages, each handing its items to a process pool of the same size."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(REGION_WORKERS) as pool:
        b = PipelineBuilder().add_source(range(n))
        b.pipe(_gil, executor=pool, concurrency=2 * REGION_WORKERS)
        b.pipe(_gil, executor=pool, concurrency=2 * REGION_WORKERS)
        return _run(b.add_sink(SINK), n)


def gil_threads(n: int) -> float:
    """The same two stages on threads (the GIL lets one run at a time)."""
    b = PipelineBuilder().add_source(range(n))
    b.pipe(_gil, concurrency=REGION_WORKERS).pipe(_gil, concurrency=REGION_WORKERS)
    return _run(b.add_sink(SINK), n)


def _torch(n: int, workers: int) -> float:
    from dataloader import (  # benchmarks/dataloader.py, beside this script
        IntDataset,
        items_per_second,
    )
    from torch.utils.data import DataLoader

    return items_per_second(DataLoader(IntDataset(n), batch_size=32, num_workers=workers), n)


CASES: list[tuple[str, Callable[[int], float], int, str]] = [
    ("3 no-op sync stages, concurrency 4", sync_stages, 200_000, ">= 50k"),
    ("3 no-op async stages", async_stages, 300_000, ">= 100k"),
    ("source to sink only", source_to_sink, 500_000, ">= 200k"),
    ("1 sync stage, sleep 10 ms, conc. 64", sync_sleep, 20_000, ">= 5.5k (limit 6.4k)"),
    ("1 async stage, sleep 10 ms, conc. 512", async_sleep, 100_000, ">= 30k (limit 51.2k)"),
    ("torch DataLoader, 0 workers, batch 32", lambda n: _torch(n, 0), 1_000_000, "reference"),
    ("torch DataLoader, 2 workers, batch 32", lambda n: _torch(n, 2), 300_000, "reference"),
    ("source to sink only, add_sink(3)", lambda n: source_to_sink(n, 3), 100_000, "(info)"),
    ("3 no-op sync stages, TaskStatsHook on", sync_stages_hooked, 50_000, "(hook cost)"),
    (
        "3 no-op async stages, TaskStatsHook on",
        lambda n: async_stages(n, hooks=True),
        100_000,
        "(hook cost)",
    ),
    ("2 GIL-bound stages, to() region, 2 procs", region, 4_000, "(region)"),
    ("2 GIL-bound stages, pipe(executor=pool)", per_item_processes, 4_000, "(region)"),
    ("2 GIL-bound stages, threads", gil_threads, 4_000, "(region)"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a tenth of the items per run")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.machine()}; median of {args.repeats} runs"
    )
    print(f"{'case':<40}{'items/s':>12}{'spread':>22}   target")
    for name, fn, n, target in CASES:
        if args.only and args.only not in name:
            continue
        if args.quick:
            n //= 10
        rates = [fn(n) for _ in range(args.repeats)]
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        print(f"{name:<40}{statistics.median(rates):>12,.0f}{spread:>22}   {target}", flush=True)


if __name__ == "__main__":
    main()
