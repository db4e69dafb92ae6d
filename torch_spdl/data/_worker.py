"""Worker identity for loader threads: torch's ``get_worker_info()``, per thread.

torch keeps worker information in a module global, which works because each worker is a
process. Loader workers here are threads of one process, so the information lives in a
``threading.local``; each worker thread gets an id, a seed (``base_seed + id``, as torch
computes it) and its own random generators, and ``worker_init_fn`` runs once in it before
its first sample, all without touching the global RNG.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "WorkerInfo",
    "get_worker_info",
    "WorkerGroup",
    "init_process_worker",
    "set_process_worker_info",
    "single_threaded_ops",
]

_OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()


def single_threaded_ops() -> None:
    """Run this thread's torch ops on one intra-op thread (once per thread, cheap after).

    torch's worker processes do the same. Here it matters even more: a loader thread's
    ``torch.stack`` on the machine's default OpenMP team competes with every other loader
    thread and with the training loop (measured: 1.15 ms against 0.37 ms for a batch of 32
    images on 2 cores). OpenMP keeps the setting per thread, so the training loop's
    threads are untouched; with another parallel backend the setting would be
    process-wide, so it is left alone there.
    """
    if _OPENMP and not getattr(_LOCAL, "single_threaded", False):
        torch.set_num_threads(1)
        _LOCAL.single_threaded = True


_LOCAL = threading.local()


@dataclass
class WorkerInfo:
    """What a loader worker thread knows about itself (mirrors torch's ``WorkerInfo``)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any
    generator: torch.Generator = field(repr=False)  # seeded with ``seed``
    random: random.Random = field(repr=False)  # seeded with ``seed``


def get_worker_info() -> WorkerInfo | None:
    """The calling loader thread's :class:`WorkerInfo`, or ``None`` outside a loader."""
    return getattr(_LOCAL, "info", None)


def _make_info(wid: int, num_workers: int, seed: int, dataset: Any) -> WorkerInfo:
    return WorkerInfo(
        id=wid,
        num_workers=num_workers,
        seed=seed,
        dataset=dataset,
        generator=torch.Generator().manual_seed(seed),
        random=random.Random(seed),
    )


# The dataset of a worker process, sent once by its initializer rather than with each sample.
PROCESS_DATASET: Any = None


def set_process_worker_info(wid: int, num_workers: int, base_seed: int, dataset: Any) -> None:
    """Make this process worker ``wid`` as torch's worker loop does: one intra-op thread,
    ``random`` and torch seeded with ``base_seed + wid``, NumPy with the state torch derives
    from both, and ``get_worker_info()`` answering (torch's and ours)."""
    from torch.utils.data._utils import worker as torch_worker

    torch.set_num_threads(1)
    seed = base_seed + wid
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    else:
        np.random.seed(torch_worker._generate_state(base_seed, wid))
    _LOCAL.info = _make_info(wid, num_workers, seed % 2**63, dataset)
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=wid, num_workers=num_workers, seed=seed, dataset=dataset
    )


def init_process_worker(
    dataset: Any,
    counter: Any,
    num_workers: int,
    base_seed: int,
    init_fn: Callable[[int], None] | None,
) -> None:
    """Initializer of a per-sample process pool's worker (a stage declared with
    ``executor="process"``): the same set-up as a loader's worker process."""
    global PROCESS_DATASET
    PROCESS_DATASET = dataset
    with counter.get_lock():
        wid = counter.value
        counter.value += 1
    set_process_worker_info(wid, num_workers, base_seed, dataset)
    if init_fn is not None:
        init_fn(wid)


def getitem_in_process(index: Any) -> Any:
    """``dataset[index]`` on the worker process's copy of the dataset."""
    return PROCESS_DATASET[index]


def _reseeds_process(fn: Callable[[int], None] | None) -> bool:
    """Lightning's ``pl_worker_init_function`` (what ``seed_everything(workers=True)``
    attaches) reseeds the process-wide RNGs: right in a worker process, wrong in a thread
    of the training process, whose RNGs it would reseed mid-run."""
    target = getattr(fn, "func", fn)
    return getattr(target, "__name__", "") == "pl_worker_init_function" and getattr(
        target, "__module__", ""
    ).startswith(("lightning", "pytorch_lightning"))


class WorkerGroup:
    """Hands out worker ids to the threads of one loader epoch (or of persistent workers)."""

    def __init__(
        self,
        num_workers: int,
        base_seed: int,
        dataset: Any,
        init_fn: Callable[[int], None] | None,
    ) -> None:
        self.num_workers = num_workers
        self.base_seed = base_seed
        self.dataset = dataset
        # Worker threads are seeded through their WorkerInfo generators instead.
        self.init_fn = None if _reseeds_process(init_fn) else init_fn
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def enter(self) -> None:
        """Make sure the calling thread is a worker of this group (cheap after the first)."""
        info = getattr(_LOCAL, "info", None)
        if info is not None and getattr(_LOCAL, "group", None) is self:
            return
        with self._lock:
            wid = next(self._ids)
        _LOCAL.group = self
        seed = (self.base_seed + wid) % 2**63
        _LOCAL.info = _make_info(wid, self.num_workers, seed, self.dataset)
        if self.init_fn is not None:
            self.init_fn(wid)
