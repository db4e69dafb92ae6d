"""The pipeline of one DataLoader epoch, declared from its plan, and the parts it owns.

:class:`EpochParts` turns an :class:`~._epoch_plan.EpochPlan` into a pipeline: per sample
through the dataset's stages then rebatch and collate, whole batches on threads, batches
from worker processes, or an iterable dataset's samples or its workers' batches. It owns
what that pipeline waits on outside the engine (the batch tokens, this epoch's worker
threads or processes) and releases it; what outlives the epoch it asks of the loader's
:class:`~._epoch_plan.LoaderResources`. The epoch (``_epoch.py``) consumes the pipeline.

Every stage declared with ``"auto"`` concurrency gets an id chosen here (its stage name:
``"collate"``, ``"load"``, ...); where the autotuner left it is recorded under that id so
that the next epoch starts it there.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from ..pipeline import PipelineBuilder, StageStats
from ._batch_stages import LoadInThreads, SendToWorkers, SettleBatch, receive_from_workers
from ._batch_transfer import BatchMover
from ._batching import (
    Collate,
    FailureBudget,
    Rebatch,
    RebatchCollate,
    Slots,
    Tagged,
    Tokens,
    load_inline,
)
from ._collate import is_default_collate
from ._epoch_plan import EpochPlan, LoaderResources, Loading
from ._epoch_workers import EpochWorkers
from ._iterable_processes import process_batches
from ._iterable_workers import IterableWorkers
from ._process_pool import ProcessWorkers
from ._sample_stages import AutoStages, StageSpec, bound, split_point, stage_specs
from ._worker_choice import WINDOW_BATCHES, Probe, SwitchGate, WorkerChoice

__all__ = ["EpochParts"]

Batches = Iterator[tuple[int, list[Any]]]
# Made batches waiting for the next stage: batches are large (a queue of the engine's
# default 64 held 64 MB of 1 MB batches, more memory than torch's whole loader).
_BATCH_QUEUE = 2


class EpochParts:
    """Declares an epoch's pipelines and owns what they wait on outside the engine.

    Args:
        plan: the epoch's settings.
        resources: what the loader keeps across epochs.
        base_seed: the workers' base seed, drawn by the epoch as torch draws it.
        budget: the epoch's failure budget (shared by every pipeline of the epoch).
        gate: where ``worker_type="auto"`` stops the probing pipeline, when it probes.
    """

    def __init__(
        self,
        plan: EpochPlan,
        resources: LoaderResources,
        base_seed: int,
        budget: FailureBudget,
        gate: SwitchGate | None,
    ) -> None:
        self._plan = plan
        self._resources = resources
        self._budget = budget
        self._gate = gate
        self._workers = EpochWorkers(plan, resources, base_seed)
        self._tokens: Tokens | None = None
        self._held = 0  # batches held outside the sink by a whole-batch path
        self._iterable: IterableWorkers | None = None
        #: The worker processes this epoch's batches come from, if any.
        self.loading: ProcessWorkers | None = None
        #: ``worker_type="auto"``'s measurements, while it probes.
        self.probe: Probe | None = None
        self._auto = AutoStages(resources)  # the "auto" stages of the last pipeline
        # What the epoch had delivered when the pipeline was declared (set by build_*).
        self._done = 0
        self._skip: set[int] = set()

    # -- the two entry points ------------------------------------------------------------------
    def build_iterable(self, done: int) -> PipelineBuilder[Any, Any]:
        """An iterable dataset's epoch, skipping the ``done`` batches delivered before."""
        self._start(done, set())
        source = self._iterable_source(done)
        plan = self._plan
        cc = plan.collate_concurrency
        builder = PipelineBuilder[Any, Any]().add_source(source)
        if self.loading is not None:  # worker processes collated them
            return self._finish(builder)
        if plan.auto_collation and not self._workers.any:  # workers make their batches
            assert plan.batch_size is not None, "automatic batching has a batch size"
            builder.aggregate(plan.batch_size, drop_last=plan.drop_last)
        builder.pipe(
            self._collate(),
            concurrency=cc,
            output_order=self._order(),
            **self._auto.declare("collate", cc, "cpu"),
        )
        return self._finish(builder)

    def build_map(
        self, loading: Loading, batches: Batches, done: int, extra: set[int]
    ) -> PipelineBuilder[Any, Any]:
        """The pipeline of a map-style epoch for ``loading`` over ``batches``, when
        batches ``[0, done)`` and ``extra`` were delivered."""
        self._start(done, extra)
        plan = self._plan
        dataset = plan.dataset
        if loading == "inline":
            specs = self._stage_specs(None)
            source = self._slots(specs, batches)
            fused = RebatchCollate(self._rebatch(), self._collate())
            builder = PipelineBuilder[Any, Any]().add_source(
                load_inline(source, specs[0].op, fused)
            )
            return self._finish(builder)
        if loading == "staged":
            split = split_point(dataset, plan.worker_type, plan.num_workers)
            if split is None:
                return self._build_samples(None, batches)
            return self._build_processes(split, batches)
        if loading == "probe":
            threads = plan.threads
            current = WorkerChoice("thread", threads, True, "measuring")
            self.probe = Probe(min(WINDOW_BATCHES, threads))
            op = LoadInThreads(
                dataset,
                self._collate().collate_fn,
                plan.auto_collation,
                self._workers.thread_group(threads),
                probe=self.probe,
                gate=self._gate,
                on_choice=_weakly(self._resources.chose),
                current=current,
                batch_size=plan.batch_size or 1,
            )
            return self._build_batches(op, threads, batches)
        assert isinstance(loading, WorkerChoice), f"a map-style epoch needs a plan: {loading}"
        if loading.kind == "process":
            return self._build_processes(-1, batches)
        if loading.per_batch:
            op = LoadInThreads(
                dataset,
                self._collate().collate_fn,
                plan.auto_collation,
                self._workers.thread_group(loading.threads),
            )
            return self._build_batches(op, loading.threads, batches)
        return self._build_samples(loading.threads, batches)

    def _start(self, done: int, extra: set[int]) -> None:
        self._done = done
        self._skip = set(extra)  # a copy: delivering batches changes the live one
        self._auto.reset()
        self._held = 0  # set again by the whole-batch path that the new pipeline takes, if any

    def caller_processes(self) -> ProcessWorkers:
        """The worker processes of an epoch whose batches the calling thread sends and
        reads itself (``_caller.WorkerFeed``): no pipeline, no receiver thread."""
        self._resources.drop_recycled_buffers()
        workers = self.loading = self._workers.processes(receiver=False)
        return workers

    # -- sources -------------------------------------------------------------------------------
    def _iterable_source(self, done: int) -> Iterator[Any]:
        """Samples (no workers: batched in the pipeline, as torch batches them in one
        process) or the workers' own batches, round-robin (see ``_iterable_workers``)."""
        plan = self._plan
        if not self._workers.any:
            samples = iter(plan.dataset)
            if done:  # an IterableDataset can only be skipped by reading it again
                per_batch = plan.batch_size if plan.auto_collation and plan.batch_size else 1
                samples = itertools.islice(samples, done * per_batch, None)
            return samples
        if plan.worker_type == "process":
            workers = self.loading = self._workers.processes()
            batches = process_batches(workers, plan.prefetch_factor, plan.in_order)
            return itertools.islice(batches, done, None)
        group = self._workers.thread_group(plan.num_workers)
        assert group is not None, "an epoch with workers has their group"
        self._iterable = IterableWorkers(
            plan.dataset,
            group,
            plan.batch_size if plan.auto_collation else None,
            plan.drop_last,
            plan.prefetch_factor,
            plan.in_order,
        )
        return itertools.islice(self._iterable.batches(), done, None)

    def _slots(self, specs: list[StageSpec], batches: Batches) -> Slots:
        self._tokens = Tokens(self._token_count(specs))
        return Slots(batches, self._tokens)

    def _token_count(self, specs: list[StageSpec]) -> int:
        """Batches in flight before rebatch: enough to keep every worker of every stage busy."""
        workers = sum(bound(spec.concurrency, spec.kind) for spec in specs)
        plan = self._plan
        per_batch = plan.batch_size if plan.auto_collation and plan.batch_size else 1
        return -(-workers // per_batch) + 2

    # -- the paths -----------------------------------------------------------------------------
    def _build_batches(self, op: Any, threads: int, batches: Batches) -> PipelineBuilder[Any, Any]:
        """Whole batches on ``threads`` threads (the op collates), then the failure budget."""
        builder = PipelineBuilder[Any, Any]().add_source(batches)
        builder.pipe(
            op,
            concurrency=threads,
            executor=self._workers.pool(threads),
            output_order=self._order(),
            name="getitem",
        )
        return self._settle(builder, self._collate().collate_fn, threads)

    def _settle(
        self, builder: PipelineBuilder[Any, Any], collate_fn: Any, loading: int
    ) -> PipelineBuilder[Any, Any]:
        """The failure budget on whole batches (``collate_fn`` collates what is left of a
        batch some of whose samples were skipped), then the end of the pipeline."""
        builder.pipe(
            SettleBatch(self._budget, collate_fn, self._plan.auto_collation),
            name="settle",
            queue_size=_BATCH_QUEUE,
        )
        self._held = loading + _BATCH_QUEUE
        return self._finish(builder)

    def _build_processes(self, split: int, batches: Batches) -> PipelineBuilder[Any, Any]:
        """Batches loaded and collated in worker processes; with ``split >= 0`` the stages
        before it run per sample on threads first."""
        plan = self._plan
        self._resources.drop_recycled_buffers()
        workers = self.loading = self._workers.processes()
        if split < 0:
            builder = PipelineBuilder[Any, Any]().add_source(batches)
        else:
            specs = self._stage_specs(None)[:split]
            builder = PipelineBuilder[Any, Any]().add_source(self._slots(specs, batches))
            self._add_stages(builder, specs)
            builder.pipe(self._rebatch(with_index=True), name="rebatch")
        # One thread sends in batch order (each worker then runs its batches in torch's
        # order); the results are waited for in order, or by one thread per batch in flight.
        in_flight = workers.num_workers * plan.prefetch_factor
        builder.pipe(SendToWorkers(workers, split), name="send")
        builder.pipe(
            receive_from_workers,
            concurrency=1 if plan.in_order else in_flight,
            output_order=self._order(),
            name="getitem" if split < 0 else "process",
        )
        return self._settle(builder, plan.collate_fn, in_flight)

    def _build_samples(self, threads: int | None, batches: Batches) -> PipelineBuilder[Any, Any]:
        """One sample at a time through the stages (``threads`` runs ``__getitem__``), then
        rebatch and collate."""
        cc = self._plan.collate_concurrency
        cc_max = bound(cc, "cpu")
        specs = self._stage_specs(threads)
        builder = PipelineBuilder[Any, Any]().add_source(self._slots(specs, batches))
        rebatch = self._rebatch()
        self._add_stages(builder, specs)
        collate = self._collate()
        if cc == 1:
            builder.pipe(RebatchCollate(rebatch, collate), name="rebatch+collate")
        else:
            # Queues of batches hold just enough for their stage's workers: batches are large.
            batch_queue = (min(cc_max, 4) if cc == "auto" else cc_max) + 1
            builder.pipe(rebatch, name="rebatch")
            builder.pipe(
                collate,
                concurrency=cc,
                **self._auto.declare("collate", cc, "cpu"),
                output_order=self._order(),
                queue_size=batch_queue,
            )
        return self._finish(builder)

    def _add_stages(self, builder: PipelineBuilder[Any, Any], specs: list[StageSpec]) -> None:
        for spec in specs:  # completion order: rebatch restores the order
            builder.pipe(
                spec.op,
                concurrency=spec.concurrency,
                executor=spec.executor,
                **self._auto.declare(spec.name, spec.concurrency, spec.kind, spec.floor),
            )

    def _finish(self, builder: PipelineBuilder[Any, Any]) -> PipelineBuilder[Any, Any]:
        plan = self._plan
        mover = BatchMover(plan.device, plan.pin_memory)
        if mover.active:
            builder.pipe(Tagged(mover, tagged=plan.map_style), name="transfer", queue_size=2)
        return builder.add_sink(self._buffer_size())

    # -- pieces --------------------------------------------------------------------------------
    def _order(self) -> Literal["input", "completion"]:
        return "input" if self._plan.in_order else "completion"

    def _rebatch(self, with_index: bool = False) -> Rebatch:
        assert self._tokens is not None, "the slots come first"
        return Rebatch(
            self._tokens,
            self._budget,
            self._plan.in_order,
            self._done,
            set(self._skip),
            with_index=with_index,
        )

    def _collate(self) -> Collate:
        plan = self._plan
        collate_fn = plan.collate_fn
        if is_default_collate(collate_fn):
            # buffers in use: the sink, the collate workers, the consumer's batch, one spare
            # (pooling every batch a whole-batch path holds kept more memory: measured)
            cc_max = bound(plan.collate_concurrency, "cpu")
            collate_fn = self._resources.recycling_collate(self._buffer_size() + cc_max + 2)
        return Collate(collate_fn, plan.auto_collation, tagged=plan.map_style)

    def _buffer_size(self) -> int:
        """The sink's batches: torch's ``prefetch_factor * num_workers`` batches in flight,
        less the training loop's own batch and those the whole-batch paths already hold
        (a batch per loading thread or worker arena, and the settle queue), so that no more
        large batches exist at once than under torch."""
        plan = self._plan
        if plan.buffer_size:
            return plan.buffer_size
        return max(plan.prefetch_factor * plan.num_workers - self._held - 1, 1)

    def _stage_specs(self, threads: int | None) -> list[StageSpec]:
        workers = threads or self._plan.threads
        return stage_specs(
            self._plan, threads, self._workers.pool(workers), self._workers.thread_group(workers)
        )

    def record_tuning(self, stats: Sequence[StageStats]) -> None:
        """Keep where the last pipeline's ``"auto"`` stages settled, for the next epoch."""
        self._auto.record(stats)

    # -- the end -------------------------------------------------------------------------------
    def release(self) -> None:
        """Wake whatever the pipeline's threads may wait on outside the pipeline: the
        source's batch tokens, worker processes, iterable worker threads."""
        if self._tokens is not None:
            self._tokens.close()
        self._workers.release()
        if self._iterable is not None:
            self._iterable.close()


def _weakly(method: Callable[[Any], None]) -> Callable[[Any], None]:
    """``method``, called only while its object lives (a stage op must not keep the
    loader's resources alive: persistent worker threads stop when they are collected)."""
    ref = weakref.WeakMethod(method)

    def call(arg: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(arg)

    return call
