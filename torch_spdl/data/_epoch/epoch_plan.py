"""What a DataLoader hands each epoch: a frozen plan, and the resources it keeps.

An epoch needs some thirty of its loader's settings (torch's private ones among them:
the index sampler, automatic batching) and the things the loader keeps across epochs.
Rather than the loader itself, it gets an :class:`EpochPlan`, made by the loader at
``__iter__`` (every setting, fixed for the epoch, so changing the loader mid-epoch cannot
change a running one), and the loader's :class:`LoaderResources`: what outlives an epoch
(persistent worker threads and their ids, persistent worker processes, the recycled
collate buffers, where ``"auto"`` stages settled, what ``worker_type="auto"`` chose). The
epoch asks the resources through their small interface; of the loader it only calls
``len()`` (``EpochPlan.length``, which a subclass may define).
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._loading.batch_workers import BatchWorkers
from .._loading.collate import RecyclingCollate
from .._loading.worker_info import WorkerGroup
from .thread_or_process import WorkerChoice

__all__ = ["EpochPlan", "Loading", "LoaderResources", "warn_past_reported_length"]

_LG = logging.getLogger("torch_spdl.data")

Concurrency = int | Literal["auto"]
#: How a map-style epoch loads its samples: ``"caller"`` (no workers: inside ``next()``,
#: as torch does), ``"inline"`` (no workers, on one background thread: asked for with
#: ``worker_type="thread"`` or ``"auto"``), ``"staged"`` (the
#: dataset's stages, per sample), ``"probe"`` (``worker_type="auto"`` still measuring) or
#: what was chosen; None for an iterable dataset.
Loading = WorkerChoice | Literal["caller", "inline", "staged", "probe"] | None


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """The loader's settings for one epoch (torch's meaning unless said otherwise)."""

    epoch: int
    dataset: Any
    map_style: bool
    #: torch's batch sampler (or sampler, without automatic batching): what the epoch
    #: draws its batches' indices from.
    index_sampler: Any
    #: ``len()`` of the loader (torch's rules, or a subclass's).
    length: Callable[[], int]
    generator: torch.Generator | None
    batch_size: int | None
    #: torch's automatic batching: samples are collated into batches of ``batch_size``.
    auto_collation: bool
    drop_last: bool
    collate_fn: Callable[[Any], Any]
    num_workers: int
    worker_type: Literal["auto", "thread", "process", "ray"]
    #: Ray's actor options and the loader's own (``worker_type="ray"``).
    ray_options: dict[str, Any]
    worker_init_fn: Callable[[int], None] | None
    per_worker_dataset: bool
    #: added to a worker process's niceness once it computes (``_workers.worker_priority``).
    worker_nice: int
    persistent_workers: bool
    multiprocessing_context: Any
    #: batches in flight per worker (torch's ``prefetch_factor``, 2 when unset).
    prefetch_factor: int
    in_order: bool
    #: seconds ``next()`` waits for a batch, or None for no limit.
    timeout: float | None
    io_concurrency: Concurrency | None
    cpu_concurrency: Concurrency | None
    collate_concurrency: Concurrency
    buffer_size: int | None
    device: str | torch.device | None
    pin_memory: bool
    max_failures: int
    loading: Loading
    #: For an IterableDataset whose length ``len(loader)`` reported (torch's
    #: ``_IterableDataset_len_called``): that length. An epoch that yields more batches
    #: warns, as torch's does (a dataset not sharded across workers yields it N times).
    reported_length: int | None = None

    @property
    def threads(self) -> int:
        """Loading threads: ``num_workers``, at least one."""
        return max(self.num_workers, 1)


def warn_past_reported_length(plan: EpochPlan, fetched: int) -> None:
    """The epoch of an IterableDataset yielded more batches than ``len(loader)`` said."""
    text = (
        f"Length of IterableDataset {plan.dataset!r} was reported to be "
        f"{plan.reported_length} (when accessing len(dataloader)), but {fetched} samples "
        "have been fetched. "
    )
    if plan.num_workers > 0:  # torch's wording, which code and tests match
        text += (
            "For multiprocessing data-loading, this could be caused by each worker "
            "iterating the whole dataset: shard it in __iter__ with "
            "torch.utils.data.get_worker_info() (id, num_workers)."
        )
    warnings.warn(text, UserWarning, stacklevel=3)


class LoaderResources:
    """What a loader keeps across its epochs. Persistent workers stop when this object is
    collected (with its loader and the last of its epochs) or at :meth:`shutdown`."""

    def __init__(self, worker_choice: WorkerChoice | None) -> None:
        #: How ``__getitem__`` runs (see ``DataLoader.worker_choice``).
        self.worker_choice = worker_choice
        #: Samples skipped under ``max_failures`` in the current epoch.
        self.num_failures = 0
        self._executor: Executor | None = None  # persistent worker threads
        self._executor_threads = 0
        self._group: WorkerGroup | None = None  # their worker ids
        self._process_workers: BatchWorkers | None = None  # persistent worker processes
        self._finalizers: list[weakref.finalize[Any, Any]] = []
        #: The persistent workers' base seed, drawn once (by the epoch that starts them).
        self.worker_seed: int | None = None
        #: ``worker_type="ray"``: the pickled dataset in the object store, by its digest.
        self.ray_objects: dict[str, Any] = {}
        self._collate: RecyclingCollate | None = None
        # Where each "auto" stage ended last epoch, by the id the epoch gave the stage:
        # the next epoch starts it there.
        self._tuned: dict[str, int] = {}
        #: By worker id, what that worker last decided of a staged dataset's loads (True:
        #: inline; False: its threads): the next epoch's worker of that id starts there
        #: (``staged_batch.py``).
        self.staged_inline: dict[int, bool] = {}

    # -- worker threads ----------------------------------------------------------------------
    def thread_pool(self, threads: int) -> Executor:
        """The persistent worker threads (made again, once, when ``worker_type="auto"``
        chose another number of threads)."""
        if self._executor is not None and self._executor_threads != threads:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor, self._group = None, None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(threads, thread_name_prefix="torch_spdl-worker")
            self._executor_threads = threads
            self._finalizers.append(
                weakref.finalize(self, self._executor.shutdown, wait=True, cancel_futures=True)
            )
        return self._executor

    def thread_group(self, first: WorkerGroup) -> WorkerGroup:
        """The worker ids of the persistent threads: ``first`` the first time (they ran
        ``worker_init_fn`` once)."""
        if self._group is None:
            self._group = first
        return self._group

    # -- worker processes --------------------------------------------------------------------
    def process_workers(self, make: Callable[[], BatchWorkers]) -> BatchWorkers:
        """The persistent worker processes, started with ``make`` the first time."""
        if self._process_workers is None:
            self._process_workers = make()
            self._finalizers.append(weakref.finalize(self, self._process_workers.shutdown))
        return self._process_workers

    def cancel_pending(self) -> None:
        """An epoch ended: the persistent processes' waiting threads return."""
        if self._process_workers is not None:
            self._process_workers.cancel_pending()

    # -- batches -----------------------------------------------------------------------------
    def recycling_collate(self, limit: int) -> RecyclingCollate:
        """``default_collate`` into buffers reused across epochs."""
        if self._collate is None:
            self._collate = RecyclingCollate(limit)
        return self._collate

    def drop_recycled_buffers(self) -> None:
        """Batches now come from worker processes: the buffers kept for batches collated
        on threads (while ``"auto"`` measured) would be inherited by every worker."""
        self._collate = None

    # -- what epochs learned -----------------------------------------------------------------
    def tuned(self, stage_id: str) -> int | None:
        """Where the ``"auto"`` stage ``stage_id`` ended last, if it ran before."""
        return self._tuned.get(stage_id)

    def record_tuned(self, stage_id: str, concurrency: int) -> None:
        self._tuned[stage_id] = concurrency

    def chose(self, choice: WorkerChoice) -> None:
        """``worker_type="auto"`` decided (on a loader thread): kept for later epochs."""
        self.worker_choice = choice
        _LG.info("torch_spdl.DataLoader(worker_type='auto'): %s", choice)

    def shutdown(self) -> None:
        """Stop persistent workers now."""
        for finalizer in self._finalizers:
            finalizer()
        self._finalizers = []
        self._executor = None
        self._process_workers = None
        self.worker_seed = None
        self.ray_objects.clear()
