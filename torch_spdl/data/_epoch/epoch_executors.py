"""Who runs an epoch's work: its worker threads (with their ids) and worker processes.

With ``persistent_workers=True`` they are the loader's, asked of its
:class:`~.epoch_plan.LoaderResources` (and outlive the epoch); otherwise this epoch's
own, stopped with it. Either way worker processes come with the part that the epoch's
pipeline shuts down as it stops (``PipelineBuilder.add_stoppable``): this epoch's own
processes themselves, or for persistent ones the epoch's pending batches, whose waiting
threads then return.
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor

from ...pipeline import StoppablePart
from .._loading.batch_workers import BatchWorkers
from .._loading.worker_info import WorkerGroup
from .._workers.process_pool import ProcessWorkers
from .batch_budget import BatchBudget
from .epoch_plan import EpochPlan, LoaderResources
from .stage_specs import stage_fns

__all__ = ["EpochExecutors"]


class _PendingBatches:
    """The persistent worker processes' share in one epoch: its batches still waited for,
    dropped as the epoch's pipeline stops (the processes live on)."""

    def __init__(self, resources: LoaderResources) -> None:
        self._resources = resources

    def shutdown(self) -> None:
        self._resources.cancel_pending()


class EpochExecutors:
    """The workers of one epoch.

    Args:
        plan: the epoch's settings.
        resources: what the loader keeps across epochs (persistent workers).
        base_seed: the workers' base seed, drawn by the epoch as torch draws it.
        budget: the epoch's batch bounds (a worker process's batches under way).
    """

    def __init__(
        self, plan: EpochPlan, resources: LoaderResources, base_seed: int, budget: BatchBudget
    ) -> None:
        self._plan = plan
        self._budget = budget
        self._resources = resources
        self._base_seed = base_seed
        self._group = (
            WorkerGroup(
                plan.num_workers,
                base_seed,
                plan.dataset,
                plan.worker_init_fn,
                copy_dataset=plan.per_worker_dataset,
            )
            if plan.num_workers > 0
            else None
        )

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
                copy_dataset=group.copy_dataset,
            )
        if self.pool(threads) is not None and group is not None:
            return self._resources.thread_group(group)
        return group

    def processes(self, *, receiver: bool = True) -> tuple[BatchWorkers, StoppablePart]:
        """The loader's persistent worker processes, or this epoch's own, and what the
        pipeline that uses them shuts down as it stops; ``receiver``: whether results are
        read on a receiver thread (for a pipeline) or by the thread that waits for them
        (persistent workers keep how they were first made)."""
        make = functools.partial(self._make_processes, receiver=receiver)
        if self._plan.persistent_workers:
            return self._resources.process_workers(make), _PendingBatches(self._resources)
        workers = make()
        return workers, workers

    def _make_processes(self, *, receiver: bool) -> BatchWorkers:
        plan = self._plan
        iterable = (
            None
            if plan.map_style
            else (plan.batch_size if plan.auto_collation else None, plan.drop_last)
        )
        threads_first = isinstance(plan.io_concurrency, int)  # the user said reads wait
        if plan.worker_type == "ray":
            from .._ray_actors.ray_workers import RayWorkers  # imports Ray: only when asked for

            return RayWorkers(
                plan.dataset,
                plan.num_workers,
                self._base_seed,
                plan.worker_init_fn,
                plan.collate_fn,
                plan.auto_collation,
                iterable,
                plan.ray_options,
                io_threads=io_threads(plan),
                io_threads_first=threads_first,
                shared=self._resources.ray_objects,
            )
        return ProcessWorkers(
            plan.dataset,
            plan.num_workers,
            self._base_seed,
            plan.worker_init_fn,
            plan.collate_fn,
            plan.auto_collation,
            in_flight=self._budget.per_worker,
            mp_context=plan.multiprocessing_context,
            stage_fns=stage_fns,
            iterable=iterable,
            receiver=receiver,
            nice=plan.worker_nice,
            io_threads=io_threads(plan),
            io_threads_first=threads_first,
            learned=self._resources.staged_inline,
        )


def io_threads(plan: EpochPlan) -> int:
    """How many samples of a batch a worker (a process or an actor) runs the ``io`` stages
    of at once: ``io_concurrency`` when it is a number, else every sample of the batch, up
    to 64 (the reads of one batch overlap; the next batch's wait for the batch's ``cpu``
    stages).

    With a ``batch_sampler`` the loader has no ``batch_size`` and a batch's length is the
    sampler's to choose, so the bound is 64: the worker's pool starts a thread only when a
    read is submitted with every started one busy, so a batch of 8 runs on 8 threads.
    Without automatic batching a "batch" is one sample: one thread."""
    io = plan.io_concurrency
    if isinstance(io, int):
        return io
    if not plan.auto_collation:
        return 1
    return max(1, min(plan.batch_size or 64, 64))
