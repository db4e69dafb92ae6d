"""The cases the report measures, each run in its own process by ``_measure.Runner``.

Every function returns ``{"samples": n, "seconds": s, "first_batch_s": t or None,
"cpu_s": c}``, with the CPU seconds of the process tree measured over the same section as
``seconds`` (building a dataset before the clock starts is not counted on either side). The
datasets and knobs come from the per-topic benchmarks beside this file (``dataloader.py``,
``engine.py``, ``image_decode.py``, ``swap.py``), so the report measures exactly what they
measure.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import swap
from _consumers import touch
from _measure import CpuMeter
from dataloader import (
    LARGE_KNOBS,
    ImageDataset,
    SleepDataset,
    StringDataset,
    SyncSleepStaged,
)
from torch.utils.data import DataLoader as TorchDataLoader

import torch_spdl

# torch's advice to use at most os.cpu_count() worker processes; the sweep asks for more.
warnings.filterwarnings("ignore", message="This DataLoader will create")


def _epochs(make: Callable[[], Iterable[Any]], epochs: int) -> dict[str, Any]:
    """Make the loader, read ``epochs`` epochs of it (every page of every batch)."""
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    loader = make()
    first: float | None = None
    count = 0
    for _ in range(epochs):
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            touch(batch)
            count += len(batch)
    seconds = time.perf_counter() - t0
    meter.stop()
    return {"samples": count, "seconds": seconds, "first_batch_s": first, "cpu_s": meter.cpu_s}


def images(impl: str, workers: int, batch: int, n: int, epochs: int, tuned: bool) -> dict:
    """3x224x224 uint8 samples (147 KiB each, cheap to make, heavy to move)."""
    if impl == "torch":
        return _epochs(
            lambda: TorchDataLoader(ImageDataset(n), batch_size=batch, num_workers=workers),
            epochs,
        )
    knobs: dict[str, Any] = dict(LARGE_KNOBS) if tuned else {"num_workers": workers}
    return _epochs(
        lambda: torch_spdl.DataLoader(ImageDataset(n), batch_size=batch, **knobs), epochs
    )


def sleep_io(impl: str, concurrency: int, n: int, batch: int) -> dict:
    """Every sample waits 10 ms (a remote read); ``concurrency`` reads at once."""
    if impl == "torch":
        return _epochs(
            lambda: TorchDataLoader(SleepDataset(n), batch_size=batch, num_workers=concurrency),
            1,
        )
    return _epochs(
        lambda: torch_spdl.DataLoader(
            SyncSleepStaged(n), batch_size=batch, num_workers=1, io_concurrency=concurrency
        ),
        1,
    )


def strings(impl: str, n: int, workers: int) -> dict:
    """A dataset of ``n`` Python strings, shuffled: torch's workers copy the pages they touch."""
    cls = TorchDataLoader if impl == "torch" else torch_spdl.DataLoader
    dataset = StringDataset(n)
    return _epochs(lambda: cls(dataset, batch_size=256, shuffle=True, num_workers=workers), 1)


def decode(impl: str, root: str, batch: int) -> dict:
    """JPEG files -> 224x224 uint8 batches, 2 workers (``image_decode.py``'s end-to-end case)."""
    import image_decode

    meter = CpuMeter()
    meter.start()
    if impl == "torch":
        n, seconds = image_decode.torch_epoch(Path(root), batch)
    else:
        paths = sorted(Path(root).rglob("*.jpg"))
        n, seconds = image_decode.spdl_epoch(paths, batch)
    meter.stop()  # also counts making the loader / listing the files (a few ms)
    return {"samples": n, "seconds": seconds, "first_batch_s": None, "cpu_s": meter.cpu_s}


def swap_cell(**kwargs: Any) -> dict:
    """One run of ``swap.py``'s script: the same loop with torch's DataLoader or ours."""
    return swap.run_cell(**kwargs)


def engine_case(name: str, n: int) -> dict:
    """One row of ``engine.py``: items/s through the engine (or torch's DataLoader)."""
    import engine

    fns = {case: fn for case, fn, _, _ in engine.CASES}
    meter = CpuMeter()
    meter.start()
    rate = fns[name](n)
    meter.stop()  # also counts building the pipeline (about a millisecond)
    return {"samples": n, "seconds": n / rate, "first_batch_s": None, "cpu_s": meter.cpu_s}


def peer_case(**kwargs: Any) -> dict:
    """One run of ``peers.py``: a contender of one workload (torch_spdl or a peer)."""
    import peers

    return peers.case(**kwargs)
