"""The shapes an epoch's pipeline takes, each one function from the plan to a declaration.

A DataLoader epoch loads in one of a few shapes, chosen once from its plan (by
:class:`~.epoch_pipeline.EpochParts`):

- :func:`inline_shape`: no workers, on one background thread: every sample of a batch
  loaded, rebatched and collated on the source's thread;
- :func:`sample_shape`: one sample at a time through the dataset's stages on threads, then
  rebatch and collate;
- :func:`batch_shape`: whole batches, each loaded and collated by one thread (measured
  while ``worker_type="auto"`` decides), then the failure budget;
- :func:`process_shape`: whole batches from worker processes, the stages before a staged
  dataset's split point first run per sample on threads;
- :func:`iterable_shape`: an ``IterableDataset``'s samples, batched here, or its workers'
  batches (threads or processes).

Each reads what it needs from one :class:`Declaring` and its bounds from the epoch's one
:class:`~.batch_budget.BatchBudget`, and registers what its stages wait on outside the
engine (the batch tokens, worker threads or processes) with the pipeline it declares
(``PipelineBuilder.add_stoppable``): the pipeline shuts them down as it stops.

Every stage declared with ``"auto"`` concurrency gets an id here (its stage name:
``"collate"``, ``"load"``, ...); where the autotuner left it is recorded under that id so
that the next epoch starts it there (:class:`~.stage_specs.AutoStages`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ...pipeline import PipelineBuilder, StoppablePart
from .._loading.batch_workers import BatchWorkers
from .._loading.collate import is_default_collate
from .._loading.sample_ops import (
    CollateOrError,
    Rebatch,
    RebatchCollate,
    SkipBudget,
    SlotSource,
    Tagged,
    Tokens,
    load_inline,
)
from .._workers.iterable_processes import process_batches
from .._workers.iterable_threads import IterableThreads
from .batch_budget import BatchBudget
from .batch_ops import LoadInThreads, SendToWorkers, SettleBatch, receive_from_workers
from .batch_transfer import BatchMover
from .epoch_executors import EpochExecutors
from .epoch_plan import EpochPlan, LoaderResources
from .stage_specs import AutoStages, StageSpec, bound, stage_specs
from .thread_or_process import Probe, SwitchGate, WorkerChoice

__all__ = [
    "Batches",
    "Declaring",
    "batch_shape",
    "inline_shape",
    "iterable_shape",
    "process_shape",
    "sample_shape",
]

#: ``(batch number, indices)`` of the batches still to load, in the sampler's order.
Batches = Iterator[tuple[int, list[Any]]]
Builder = PipelineBuilder[Any, Any]


@dataclass(frozen=True)
class Declaring:
    """What every shape reads while one pipeline of an epoch is declared."""

    plan: EpochPlan
    resources: LoaderResources
    executors: EpochExecutors
    budget: BatchBudget
    skips: SkipBudget
    #: The ``"auto"`` stages of this declaration (a fresh one for each).
    auto: AutoStages
    #: Batches ``[0, done)`` were delivered before this pipeline, and those in ``delivered``.
    done: int = 0
    delivered: frozenset[int] = frozenset()

    @property
    def order(self) -> Literal["input", "completion"]:
        return "input" if self.plan.in_order else "completion"


# -- the shapes ----------------------------------------------------------------------------------
def inline_shape(d: Declaring, batches: Batches) -> Builder:
    """No workers, on one background thread: sample, load, batch and collate there."""
    specs = _specs(d, None)
    tokens = _tokens(d, specs)
    fused = RebatchCollate(_rebatch(d, tokens), _collate(d))
    source = load_inline(SlotSource(batches, tokens), specs[0].op, fused)
    builder = Builder().add_source(source).add_stoppable(tokens)
    return _finish(d, builder, d.budget.sink)


def sample_shape(d: Declaring, threads: int | None, batches: Batches) -> Builder:
    """One sample at a time through the stages (``threads`` runs ``__getitem__``), then
    rebatch and collate."""
    cc = d.plan.collate_concurrency
    specs = _specs(d, threads)
    tokens = _tokens(d, specs)
    builder = Builder().add_source(SlotSource(batches, tokens)).add_stoppable(tokens)
    _add_stages(d, builder, specs)
    rebatch, collate = _rebatch(d, tokens), _collate(d)
    if cc == 1:
        builder.pipe(RebatchCollate(rebatch, collate), name="rebatch+collate")
    else:
        builder.pipe(rebatch, name="rebatch")
        builder.pipe(
            collate,
            concurrency=cc,
            **d.auto.declare("collate", cc, "cpu"),
            output_order=d.order,
            queue_size=d.budget.collate_queue,
        )
    return _finish(d, builder, d.budget.sink)


def batch_shape(
    d: Declaring,
    threads: int,
    batches: Batches,
    *,
    probe: Probe | None = None,
    gate: SwitchGate | None = None,
) -> Builder:
    """Whole batches on ``threads`` threads (each loads and collates one), then the
    failure budget; with ``probe``, measured until ``worker_type="auto"`` decides (and
    ``gate`` sets the rest aside when it chose another shape)."""
    plan = d.plan
    collate_fn = _collate(d).collate_fn
    measuring: dict[str, Any] = {}
    if probe is not None:
        measuring = {
            "probe": probe,
            "gate": gate,
            "on_choice": _weakly(d.resources.chose),
            "current": WorkerChoice("thread", threads, per_batch=True, reason="measuring"),
            "batch_size": plan.batch_size or 1,
        }
    group = d.executors.thread_group(threads)
    op = LoadInThreads(
        plan.dataset, collate_fn, group, auto_collation=plan.auto_collation, **measuring
    )
    builder = Builder().add_source(batches)
    builder.pipe(
        op,
        concurrency=threads,
        executor=d.executors.pool(threads),
        output_order=d.order,
        name="getitem",
    )
    return _settle(d, builder, collate_fn, holding=threads)


def process_shape(
    d: Declaring,
    workers: BatchWorkers,
    stopper: StoppablePart,
    batches: Batches,
    *,
    split: int | None,
) -> Builder:
    """Batches loaded and collated in ``workers`` (whose ``stopper`` the pipeline shuts
    down); with a ``split`` the stages before it run per sample on threads first (None: the
    workers run ``__getitem__``)."""
    plan = d.plan
    if split is None:
        builder = Builder().add_source(batches)
    else:
        specs = _specs(d, None)[:split]
        tokens = _tokens(d, specs)
        builder = Builder().add_source(SlotSource(batches, tokens)).add_stoppable(tokens)
        _add_stages(d, builder, specs)
        builder.pipe(_rebatch(d, tokens, with_index=True), name="rebatch")
    builder.add_stoppable(stopper)
    # One thread sends in batch order (each worker then runs its batches in torch's
    # order); the results are waited for in order, or by one thread per batch in flight.
    in_flight = d.budget.in_flight
    builder.pipe(SendToWorkers(workers, split), name="send")
    builder.pipe(
        receive_from_workers,
        concurrency=1 if plan.in_order else in_flight,
        output_order=d.order,
        name="getitem" if split is None else "process",
    )
    return _settle(d, builder, plan.collate_fn, holding=in_flight)


def iterable_shape(d: Declaring, processes: tuple[BatchWorkers, StoppablePart] | None) -> Builder:
    """An ``IterableDataset``'s epoch, past the ``d.done`` batches delivered before:
    its samples read here and batched in the pipeline (as torch batches them in one
    process), or its workers' own batches, round-robin (``_workers.iterable_threads``), from
    threads or from ``processes`` (which collated them too)."""
    plan = d.plan
    builder = Builder()
    if processes is not None:
        workers, stopper = processes
        # Ray's tasks are read in torch's order (they are no futures to wait on together)
        in_order = plan.in_order or plan.worker_type == "ray"
        batches = process_batches(workers, d.budget.per_worker, in_order=in_order)
        builder.add_source(itertools.islice(batches, d.done, None)).add_stoppable(stopper)
        return _finish(d, builder, d.budget.sink)
    if not d.executors.any:
        samples = iter(plan.dataset)
        if d.done:  # an IterableDataset can only be skipped by reading it again
            per_batch = plan.batch_size if plan.auto_collation and plan.batch_size else 1
            samples = itertools.islice(samples, d.done * per_batch, None)
        builder.add_source(samples)
        if plan.auto_collation:  # in this process the pipeline makes the batches
            assert plan.batch_size is not None, "automatic batching has a batch size"
            builder.aggregate(plan.batch_size, drop_last=plan.drop_last)
    else:
        group = d.executors.thread_group(plan.num_workers)
        assert group is not None, "an epoch with workers has their group"
        threads = IterableThreads(
            plan.dataset,
            group,
            plan.batch_size if plan.auto_collation else None,
            drop_last=plan.drop_last,
            prefetch=d.budget.per_worker,
            in_order=plan.in_order,
        )
        builder.add_source(itertools.islice(threads.batches(), d.done, None))
        builder.add_stoppable(threads)
    cc = plan.collate_concurrency
    builder.pipe(
        _collate(d), concurrency=cc, output_order=d.order, **d.auto.declare("collate", cc, "cpu")
    )
    return _finish(d, builder, d.budget.sink)


# -- their pieces --------------------------------------------------------------------------------
def _specs(d: Declaring, threads: int | None) -> list[StageSpec]:
    workers = threads or d.plan.threads
    pool, group = d.executors.pool(workers), d.executors.thread_group(workers)
    return stage_specs(d.plan, threads, pool, group)


def _tokens(d: Declaring, specs: list[StageSpec]) -> Tokens:
    """Batches in flight before rebatch: enough to keep every worker of every stage busy."""
    workers = sum(bound(spec.concurrency, spec.kind) for spec in specs)
    plan = d.plan
    per_batch = plan.batch_size if plan.auto_collation and plan.batch_size else 1
    return Tokens(-(-workers // per_batch) + 2)


def _add_stages(d: Declaring, builder: Builder, specs: list[StageSpec]) -> None:
    for spec in specs:  # completion order: rebatch restores the order
        builder.pipe(
            spec.op,
            concurrency=spec.concurrency,
            executor=spec.executor,
            **d.auto.declare(spec.name, spec.concurrency, spec.kind, spec.floor),
        )


def _rebatch(d: Declaring, tokens: Tokens, *, with_index: bool = False) -> Rebatch:
    ordered = d.plan.in_order
    skip = set(d.delivered)
    return Rebatch(tokens, d.skips, d.done, skip, ordered=ordered, with_index=with_index)


def _collate(d: Declaring) -> CollateOrError:
    plan = d.plan
    collate_fn = plan.collate_fn
    if is_default_collate(collate_fn):
        collate_fn = d.resources.recycling_collate(d.budget.recycled)
    return CollateOrError(collate_fn, auto=plan.auto_collation, tagged=plan.map_style)


def _settle(d: Declaring, builder: Builder, collate_fn: Any, *, holding: int) -> Builder:
    """The failure budget on whole batches (``collate_fn`` collates what is left of a
    batch some of whose samples were skipped), then the end of the pipeline, whose sink
    gets what the ``holding`` loaders and the settle queue leave of the budget."""
    settle = SettleBatch(d.skips, collate_fn, auto_collation=d.plan.auto_collation)
    builder.pipe(settle, name="settle", queue_size=d.budget.settle_queue)
    return _finish(d, builder, d.budget.sink_after(holding))


def _finish(d: Declaring, builder: Builder, sink: int) -> Builder:
    plan = d.plan
    mover = BatchMover(plan.device, pin_memory=plan.pin_memory)
    if mover.active:
        builder.pipe(Tagged(mover, tagged=plan.map_style), name="transfer", queue_size=2)
    return builder.add_sink(sink)


def _weakly(method: Callable[[Any], None]) -> Callable[[Any], None]:
    """``method``, called only while its object lives (a stage op must not keep the
    loader's resources alive: persistent worker threads stop when they are collected)."""
    ref = weakref.WeakMethod(method)

    def call(arg: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(arg)

    return call
