"""Who runs an epoch's work: its worker threads (with their ids) and worker processes.

With ``persistent_workers=True`` they are the loader's, asked of its
:class:`~._epoch_plan.LoaderResources` (and outlive the epoch); otherwise this epoch's
own, stopped with it.
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor

from ._epoch_plan import EpochPlan, LoaderResources
from ._process_pool import ProcessWorkers
from ._sample_stages import stage_fns
from ._worker import WorkerGroup

__all__ = ["EpochWorkers"]


class EpochWorkers:
    """The workers of one epoch.

    Args:
        plan: the epoch's settings.
        resources: what the loader keeps across epochs (persistent workers).
        base_seed: the workers' base seed, drawn by the epoch as torch draws it.
    """

    def __init__(self, plan: EpochPlan, resources: LoaderResources, base_seed: int) -> None:
        self._plan = plan
        self._resources = resources
        self._base_seed = base_seed
        self._group = (
            WorkerGroup(
                plan.num_workers,
                base_seed,
                plan.dataset,
                plan.worker_init_fn,
                plan.per_worker_dataset,
            )
            if plan.num_workers > 0
            else None
        )
        self._own: ProcessWorkers | None = None  # this epoch's processes (not persistent)

    @property
    def any(self) -> bool:
        """Whether the loader has workers (``num_workers > 0``)."""
        return self._group is not None

    def pool(self, threads: int) -> Executor | None:
        """The persistent worker threads, with ``persistent_workers=True`` (else None: the
        stage makes its own)."""
        if not self._plan.persistent_workers:
            return None
        return self._resources.thread_pool(threads)

    def thread_group(self, threads: int) -> WorkerGroup | None:
        """The worker ids of this epoch's ``threads`` threads (kept across epochs with
        persistent workers, whose threads ran ``worker_init_fn`` once)."""
        group = self._group
        if group is not None and group.num_workers != threads:  # "auto" chose more
            group = self._group = WorkerGroup(
                threads,
                group.base_seed,
                group.dataset,
                self._plan.worker_init_fn,
                group.copy_dataset,
            )
        if self.pool(threads) is not None and group is not None:
            return self._resources.thread_group(group)
        return group

    def processes(self, receiver: bool = True) -> ProcessWorkers:
        """The loader's persistent worker processes, or this epoch's own; ``receiver``:
        whether results are read on a receiver thread (for a pipeline) or by the thread
        that waits for them (persistent workers keep how they were first made)."""
        make = functools.partial(self._make_processes, receiver)
        if self._plan.persistent_workers:
            return self._resources.process_workers(make)
        workers = self._own = make()
        return workers

    def _make_processes(self, receiver: bool) -> ProcessWorkers:
        plan = self._plan
        return ProcessWorkers(
            plan.dataset,
            plan.num_workers,
            self._base_seed,
            plan.worker_init_fn,
            plan.collate_fn,
            plan.auto_collation,
            in_flight=plan.prefetch_factor,
            mp_context=plan.multiprocessing_context,
            stage_fns=stage_fns,
            iterable=(
                None
                if plan.map_style
                else (plan.batch_size if plan.auto_collation else None, plan.drop_last)
            ),
            receiver=receiver,
        )

    def release(self) -> None:
        """The epoch ends: persistent processes drop its pending batches (their waiting
        threads return), its own processes stop."""
        self._resources.cancel_pending()
        if self._own is not None:
            self._own.shutdown()
            self._own = None
