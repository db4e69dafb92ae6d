"""The swap benchmark's cells and the script under test: one training loop, either loader.

A cell names a dataset, its batch size and sizes (quick, full), and the extra rows of ours
it runs (``torch_spdl-staged``, ``torch_spdl-thread``); :func:`plan` turns the cells into
run configurations and :func:`run_cell` is one run of them in a fresh process. The loop
(:func:`train_loop`) is written once and receives the DataLoader class: it passes
``dataset, batch_size, num_workers`` (and ``shuffle=True`` where a training run would) and
nothing else, which is the whole point of the benchmark (``swap.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from _consumers import consumer_of
from _consumers import touch_all as _touch_all
from _cpu_meter import CpuMeter
from _datasets import ImageDataset, IntDataset, SleepDataset, SyncSleepStaged
from _results import Spec
from _swap_datasets import NumpyAugmentDataset, PathDataset, TokenizerDataset, image_folder
from torch.utils.data import Dataset

IMPLS = ("torch", "torch_spdl")
STAGED = "torch_spdl-staged"
THREAD = "torch_spdl-thread"


@dataclass(frozen=True)
class Cell:
    key: str
    title: str
    batch: int
    make: Callable[[int, str], Dataset]  # (n, jpeg root) -> dataset, before the clock
    n: tuple[int, int]  # samples in the dataset (quick, full); 0: the JPEG folder's count
    batches: tuple[int, int] | None = None  # a fixed number of batches, else one epoch
    shuffle: bool = False
    target: float = 1.0  # torch_spdl / torch throughput the issue asks for
    per_worker: bool = False  # n scales with num_workers
    variants: tuple[str, ...] = ()  # extra rows of ours with other arguments
    quick_variants: bool = True  # whether quick mode runs them too
    staged: Callable[[int], Dataset] | None = None  # the dataset as migrate stages it


CELLS = [
    Cell(
        "sleep-io",
        "1. 10 ms blocking I/O, batch 16",
        16,
        lambda n, _: SleepDataset(n),
        (64, 200),
        per_worker=True,
        variants=(STAGED,),
        staged=SyncSleepStaged,
    ),
    Cell(
        "jpeg",
        "2. JPEG ImageFolder + PIL, batch 64",
        64,
        lambda _, root: image_folder(root),
        (0, 0),
        variants=(THREAD,),
        quick_variants=False,
    ),
    Cell(
        "tokenizer",
        "3. pure-Python tokenizer, batch 32",
        32,
        lambda n, _: TokenizerDataset(n),
        (16_384, 49_152),
        variants=(THREAD,),
        quick_variants=False,
    ),
    Cell(
        "numpy",
        "4. numpy ops on 64x64 crops, batch 64",
        64,
        lambda n, _: NumpyAugmentDataset(n),
        (4096, 16384),
    ),
    Cell(
        "images",
        "5. 3x224x224 uint8, batch 128",
        128,
        lambda n, _: ImageDataset(n),
        (64 * 128, 256 * 128),
    ),
    Cell("ints", "6. trivial ints, batch 32", 32, lambda n, _: IntDataset(n), (32_000, 128_000)),
    Cell(
        "paths",
        "7. 2M path strings, shuffled, batch 256",
        256,
        lambda n, _: PathDataset(n),
        (2_000_000, 2_000_000),
        batches=(300, 1000),
        shuffle=True,
    ),
]
CELL = {c.key: c for c in CELLS}


def loader_class(impl: str) -> Callable[..., Iterable[Any]]:
    """The DataLoader a user's script gets from its import."""
    if impl == "torch":
        from torch.utils.data import DataLoader

        return DataLoader
    from torch_spdl import DataLoader

    if impl == THREAD:
        return functools.partial(DataLoader, worker_type="thread")
    return DataLoader


def _count(batch: Any) -> int:
    """Samples in a collated batch: a tensor, ``[inputs, labels]``, or a list of strings."""
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return len(batch[0])
    return len(batch)


def train_loop(
    DataLoader: Callable[..., Iterable[Any]],  # noqa: N803 (it stands for the imported class)
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    shuffle: bool = False,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    consume: Callable[[Any], None] = _touch_all,
) -> dict[str, Any]:
    """The script both sides run: build the loader, read its batches, drop the iterator.

    Timed from building the loader until the iterator is gone (its workers stopped), as an
    epoch of a loader without ``persistent_workers``. It stops early after ``max_batches``,
    or after the batch that passes ``max_seconds`` (a guard against a pathologically slow
    side eating the whole budget; the rate is still samples over seconds)."""
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    extra = {"shuffle": True} if shuffle else {}
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **extra)
    first: float | None = None
    samples = batches = 0
    batch = None
    it = iter(loader)
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        consume(batch)
        samples += _count(batch)
        batches += 1
        if batches == max_batches or (max_seconds and time.perf_counter() - t0 > max_seconds):
            break
    del it, batch
    seconds = time.perf_counter() - t0
    meter.stop()
    return {"samples": samples, "seconds": seconds, "first_batch_s": first, "cpu_s": meter.cpu_s}


def run_cell(
    cell: str,
    impl: str,
    workers: int,
    n: int,
    batches: int | None,
    cap_s: float,
    root: str,
    consumer: str = "touch",
) -> dict:
    """One run (in a fresh process, from ``_cases.swap_cell``): dataset and consumer first,
    then the loop."""
    c = CELL[cell]
    dataset = c.staged(n) if impl == STAGED and c.staged else c.make(n, root)
    consume = consumer_of(consumer)
    return train_loop(
        loader_class(impl), dataset, c.batch, workers, c.shuffle, batches, cap_s, consume
    )


def _kw(**kwargs: object) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(kwargs.items()))


def worker_counts(quick: bool, only: int = 0) -> tuple[int, ...]:
    """The ``num_workers`` of every cell; ``only``: that one alone (0: all)."""
    counts = (2,) if quick else (2, 4)
    return tuple(w for w in counts if only in (0, w))


CAP_S = (3.0, 8.0)  # a run stops after the batch that passes this (quick, full)


def plan(
    quick: bool,
    jpeg_root: str,
    jpeg_count: int,
    only: str = "",
    consumers: tuple[str, ...] = ("touch",),
    workers: int = 0,
) -> list[Spec]:
    """Every run configuration, torch before ours for each cell, consumer and worker count
    (a spec's label is the cell's key, with ``@consumer`` for other consumers than touch)."""
    specs = []
    for c in CELLS:
        if only not in c.key:
            continue
        for consumer in consumers:
            label = c.key if consumer == "touch" else f"{c.key}@{consumer}"
            for w in worker_counts(quick, workers):
                n = c.n[not quick] * (w if c.per_worker else 1) or jpeg_count
                batches = c.batches[not quick] if c.batches else None
                variants = c.variants if c.quick_variants or not quick else ()
                for impl in (*IMPLS, *variants):
                    kw = _kw(
                        cell=c.key,
                        impl=impl,
                        workers=w,
                        n=n,
                        batches=batches,
                        cap_s=CAP_S[not quick],
                        root=jpeg_root,
                        consumer=consumer,
                    )
                    specs.append(Spec("swap", impl, w, "swap_cell", kw, label=label))
    return specs


def split_label(label: str) -> tuple[Cell, str]:
    """The cell and the consumer of a spec's label."""
    key, _, consumer = label.partition("@")
    return CELL[key], consumer or "touch"
