"""One epoch of a DataLoader: builds and owns its pipeline, tracks what was delivered."""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from ..pipeline import PipelineBuilder, PipelineFailure
from ..pipeline._autotune import DEFAULT_MAX_THREADS, cpu_count
from ._batch_stages import (
    LoadInThreads,
    SendToWorkers,
    SettleBatch,
    batch_tasks,
    receive_from_workers,
)
from ._collate import is_default_collate
from ._iterable_processes import process_batches
from ._iterable_workers import IterableWorkers
from ._process_workers import ProcessWorkers
from ._sampling import index_batches
from ._staged import Stage, StagedDataset
from ._stages import (
    BatchError,
    Collate,
    FailureBudget,
    Rebatch,
    RebatchCollate,
    Slot,
    Tagged,
    Tokens,
    load_inline,
    slots,
    stage_op,
)
from ._transfer import BatchMover
from ._worker import WorkerGroup
from ._worker_choice import WINDOW_BATCHES, Probe, SwitchGate, WorkerChoice, decide

if TYPE_CHECKING:
    from ._dataloader import DataLoader

__all__ = ["EpochIterator", "split_point", "stage_fns"]

_LG = logging.getLogger("torch_spdl.data")

_END: Any = object()
# How long stopping an epoch waits for its threads. A thread stuck in user code (a read
# that never returns) cannot be interrupted in Python: it is left to finish on its own
# (a daemon thread, reported in the log), so that it never delays an error, a timeout or
# the end of a loop that broke off.
_ABANDON_S = 0.1
# Made batches waiting for the next stage: batches are large (a queue of the engine's
# default 64 held 64 MB of 1 MB batches, more memory than torch's whole loader).
_BATCH_QUEUE = 2


class _StageSpec:
    __slots__ = ("op", "concurrency", "executor", "name", "kind", "floor")

    def __init__(
        self,
        op: Any,
        concurrency: int | str,
        executor: Executor | None,
        name: str,
        kind: str,
        floor: int | None = None,
    ) -> None:
        self.op = op
        self.concurrency = concurrency  # or "auto"
        self.executor = executor
        self.name = name
        self.kind = kind  # "io" or "cpu": what bounds an autotuned stage
        self.floor = floor  # the least an autotuned stage runs (the old fixed default)


def _bound(concurrency: int | str, kind: str) -> int:
    """A stage's concurrency, or for ``"auto"`` the most it may grow to: I/O stages wait,
    so they may have many workers; CPU stages gain nothing beyond the cores."""
    if concurrency != "auto":
        return int(concurrency)
    return DEFAULT_MAX_THREADS if kind == "io" else cpu_count()


def _auto(
    concurrency: int | str, kind: str, start: int | None = None, floor: int | None = None
) -> dict[str, Any]:
    """``pipe`` keywords bounding an autotuned stage (none for a fixed one), starting it at
    ``start`` (where it ended the epoch before) when known, never below ``floor``."""
    if concurrency != "auto":
        return {}
    most = max(_bound("auto", kind), floor or 1)
    kw: dict[str, Any] = {"max_concurrency": most}
    if start is not None:
        kw["initial_concurrency"] = max(1, min(start, most))
    if floor is not None:
        kw["min_concurrency"] = floor
        kw.setdefault("initial_concurrency", floor)
    return kw


def rng_state(gen: torch.Generator | None) -> torch.Tensor:
    """The state of the loader's generator, or of torch's global RNG without one."""
    return gen.get_state() if gen is not None else torch.get_rng_state()


def set_rng_state(gen: torch.Generator | None, state: torch.Tensor) -> None:
    """Restore what :func:`rng_state` returned."""
    if gen is not None:
        gen.set_state(state)
    else:
        torch.set_rng_state(state)


class EpochIterator:
    """Iterator over one epoch's batches. Nothing in the pipeline refers back to it, so
    dropping it stops the pipeline at once."""

    def __init__(self, loader: DataLoader, resume: dict[str, Any] | None) -> None:
        self._loader = loader
        self._map_style = not isinstance(loader.dataset, IterableDataset)
        self._closed = False
        self._exhausted = False
        gen = loader.generator
        if resume is not None:  # replay the epoch's random draws
            set_rng_state(gen, resume["rng_state"])
        self._rng_state = rng_state(gen)
        self._watermark: int = resume["delivered"] if resume else 0  # batches [0, w) delivered
        self._extra: set[int] = set(resume["extra"]) if resume else set()
        if self._map_style:
            indices = index_batches(loader._index_sampler)
        # torch draws the workers' base seed from the same generator right after making the
        # sampler iterator; doing the same keeps the sampler's draws identical to torch's.
        self._base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
        self._budget = FailureBudget(loader.max_failures)
        self._group = (
            WorkerGroup(
                loader.num_workers,
                self._base_seed,
                loader.dataset,
                loader.worker_init_fn,
                loader.per_worker_dataset,
            )
            if loader.num_workers > 0
            else None
        )
        self._tokens: Tokens | None = None
        self._held = 0  # batches held outside the sink by a whole-batch path
        self._gate: SwitchGate | None = None
        self._probe: Probe | None = None
        self._iterable: IterableWorkers | None = None
        self._workers: ProcessWorkers | None = None  # this epoch's own (not persistent)
        self._loading: ProcessWorkers | None = None  # the workers this epoch's batches come from
        if self._map_style:
            first = next(indices, _END)  # the sampler's own draws happen now, in this thread
            self._chosen = _chain(first, indices)
            plan = loader._epoch_plan()
            if plan == "probe":  # before the source: it stops where the plan changes
                self._gate = SwitchGate()
            self._pipeline = self._build_map(plan, self._batches(0)).build(max_failures=0)
        else:
            self._pipeline = self._build_iterable(self._iterable_source()).build(max_failures=0)
        self._timeout = loader.timeout if loader.timeout > 0 else None
        # The pipeline starts at the first next(), as torch's single-process iterator does:
        # code that calls iter() twice on a loader whose batch sampler is its own iterator
        # (Lightning's predict loop does) must not have the unused first epoch pull from it.
        # It is read with get_item, not its iterator, so that this epoch decides the order
        # of shutdown: worker processes first (their waiting threads then return), then the
        # pipeline.

    # -- building --------------------------------------------------------------------------
    def _iterable_source(self) -> Iterator[Any]:
        """Samples (no workers: batched in the pipeline, as torch batches them in one
        process) or the workers' own batches, round-robin (see ``_iterable_workers``)."""
        loader = self._loader
        if self._group is None:
            samples = iter(loader.dataset)
            if self._watermark:  # an IterableDataset can only be skipped by reading it again
                per_batch = loader.batch_size if loader._auto_collation else 1
                samples = itertools.islice(samples, self._watermark * per_batch, None)
            return samples
        if loader.worker_type == "process":
            workers = loader._persistent_process_workers(self._base_seed, -1)
            if workers is None:
                workers = self._workers = loader._make_process_workers(self._base_seed)
            self._loading = workers
            batches = process_batches(workers, loader.prefetch_factor or 2, loader.in_order)
            return itertools.islice(batches, self._watermark, None)
        self._iterable = IterableWorkers(
            loader.dataset,
            self._thread_group(loader.num_workers),
            loader.batch_size if loader._auto_collation else None,
            loader.drop_last,
            loader.prefetch_factor or 2,
            loader.in_order,
        )
        return itertools.islice(self._iterable.batches(), self._watermark, None)

    def _batches(self, first: int) -> Iterator[tuple[int, list[Any]]]:
        loader = self._loader
        # A copy of the restored skip set: delivering batches changes the live one.
        skip = set(self._extra)
        return batch_tasks(
            self._chosen, loader._auto_collation, first, self._watermark, skip, self._gate
        )

    def _token_count(self, specs: list[_StageSpec]) -> int:
        """Batches in flight before rebatch: enough to keep every worker of every stage busy."""
        workers = sum(_bound(spec.concurrency, spec.kind) for spec in specs)
        loader = self._loader
        per_batch = loader.batch_size if loader._auto_collation and loader.batch_size else 1
        return -(-workers // per_batch) + 2

    def _collate(self) -> Collate:
        loader = self._loader
        collate_fn = loader.collate_fn
        if is_default_collate(collate_fn):
            # buffers in use: the sink, the collate workers, the consumer's batch, one spare
            # (pooling every batch a whole-batch path holds kept more memory: measured)
            cc_max = _bound(loader.collate_concurrency, "cpu")
            collate_fn = loader._recycling_collate(self._buffer_size() + cc_max + 2)
        return Collate(collate_fn, loader._auto_collation, tagged=self._map_style)

    def _build_iterable(self, source: Iterator[Any]) -> PipelineBuilder[Any, Any]:
        loader = self._loader
        cc = loader.collate_concurrency
        builder = PipelineBuilder().add_source(source)
        if self._loading is not None:  # worker processes collated them
            return self._finish(builder)
        if loader._auto_collation and self._group is None:  # workers make their batches
            builder.aggregate(loader.batch_size, drop_last=loader.drop_last)
        builder.pipe(
            self._collate(),
            concurrency=cc,
            output_order="input" if loader.in_order else "completion",
            name="collate",
            **_auto(cc, "cpu", loader._tuned.get("collate")),
        )
        return self._finish(builder)

    def _build_map(
        self, plan: WorkerChoice | str, batches: Iterator[tuple[int, list[Any]]]
    ) -> PipelineBuilder[Any, Any]:
        """The pipeline of a map-style epoch for ``plan``: ``"inline"`` (no workers),
        ``"staged"`` (the dataset's stages, per sample), ``"probe"`` (``worker_type="auto"``
        still measuring) or a :class:`WorkerChoice`."""
        loader = self._loader
        dataset = loader.dataset
        if plan == "inline":
            specs = self._stage_specs(None)
            source = self._slots(specs, batches)
            fused = RebatchCollate(self._rebatch(), self._collate())
            builder = PipelineBuilder().add_source(load_inline(source, specs[0].op, fused))
            return self._finish(builder)
        if plan == "staged":
            split = split_point(dataset, loader.worker_type)
            if split is None:
                return self._build_samples(None, batches)
            return self._build_processes(split, batches)
        if plan == "probe":
            threads = loader._threads
            current = WorkerChoice("thread", threads, True, "measuring")
            self._probe = Probe(min(WINDOW_BATCHES, threads))
            op = LoadInThreads(
                dataset,
                self._collate().collate_fn,
                loader._auto_collation,
                self._thread_group(threads),
                probe=self._probe,
                gate=self._gate,
                on_choice=_weakly(loader._chose),
                current=current,
                batch_size=loader.batch_size or 1,
            )
            return self._build_batches(op, threads, batches)
        assert isinstance(plan, WorkerChoice)
        if plan.kind == "process":
            return self._build_processes(-1, batches)
        if plan.per_batch:
            op = LoadInThreads(
                dataset,
                self._collate().collate_fn,
                loader._auto_collation,
                self._thread_group(plan.threads),
            )
            return self._build_batches(op, plan.threads, batches)
        return self._build_samples(plan.threads, batches)

    def _build_batches(
        self, op: Any, threads: int, batches: Iterator[tuple[int, list[Any]]]
    ) -> PipelineBuilder[Any, Any]:
        """Whole batches on ``threads`` threads (the op collates), then the failure budget."""
        loader = self._loader
        builder = PipelineBuilder().add_source(batches)
        builder.pipe(
            op,
            concurrency=threads,
            executor=loader._persistent_executor(threads),
            output_order="input" if loader.in_order else "completion",
            name="getitem",
        )
        return self._settle(builder, self._collate().collate_fn, threads)

    def _settle(self, builder: PipelineBuilder[Any, Any], collate_fn: Any, loading: int) -> Any:
        """The failure budget on whole batches (``collate_fn`` collates what is left of a
        batch some of whose samples were skipped), then the end of the pipeline."""
        builder.pipe(
            SettleBatch(self._budget, collate_fn, self._loader._auto_collation),
            name="settle",
            queue_size=_BATCH_QUEUE,
        )
        self._held = loading + _BATCH_QUEUE
        return self._finish(builder)

    def _build_processes(
        self, split: int, batches: Iterator[tuple[int, list[Any]]]
    ) -> PipelineBuilder[Any, Any]:
        """Batches loaded and collated in worker processes; with ``split >= 0`` the stages
        before it run per sample on threads first."""
        loader = self._loader
        loader._drop_recycled_buffers()
        workers = loader._persistent_process_workers(self._base_seed, split)
        if workers is None:
            workers = self._workers = loader._make_process_workers(self._base_seed)
        self._loading = workers
        prefetch = loader.prefetch_factor or 2
        ordered = "input" if loader.in_order else "completion"
        if split < 0:
            builder = PipelineBuilder().add_source(batches)
        else:
            specs = self._stage_specs(None)[:split]
            builder = PipelineBuilder().add_source(self._slots(specs, batches))
            self._add_stages(builder, specs)
            builder.pipe(self._rebatch(with_index=True), name="rebatch")
        # One thread sends in batch order (each worker then runs its batches in torch's
        # order); the results are waited for in order, or by one thread per batch in flight.
        builder.pipe(SendToWorkers(workers, split), name="send")
        builder.pipe(
            receive_from_workers,
            concurrency=1 if loader.in_order else workers.num_workers * prefetch,
            output_order=ordered,
            name="getitem" if split < 0 else "process",
        )
        return self._settle(builder, loader.collate_fn, workers.num_workers * prefetch)

    def _build_samples(
        self, threads: int | None, batches: Iterator[tuple[int, list[Any]]]
    ) -> PipelineBuilder[Any, Any]:
        """One sample at a time through the stages (``threads`` runs ``__getitem__``), then
        rebatch and collate."""
        loader = self._loader
        cc = loader.collate_concurrency
        cc_max = _bound(cc, "cpu")
        specs = self._stage_specs(threads)
        builder = PipelineBuilder().add_source(self._slots(specs, batches))
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
                **_auto(cc, "cpu", loader._tuned.get("collate")),
                output_order="input" if loader.in_order else "completion",
                name="collate",
                queue_size=batch_queue,
            )
        return self._finish(builder)

    def _add_stages(self, builder: PipelineBuilder[Any, Any], specs: list[_StageSpec]) -> None:
        tuned = self._loader._tuned
        for spec in specs:  # completion order: rebatch restores the order
            builder.pipe(
                spec.op,
                concurrency=spec.concurrency,
                executor=spec.executor,
                name=spec.name,
                **_auto(spec.concurrency, spec.kind, tuned.get(spec.name), spec.floor),
            )

    def _slots(
        self, specs: list[_StageSpec], batches: Iterator[tuple[int, list[Any]]]
    ) -> Iterator[Slot]:
        self._tokens = Tokens(self._token_count(specs))
        return slots(batches, self._tokens)

    def _rebatch(self, with_index: bool = False) -> Rebatch:
        assert self._tokens is not None, "the slots come first"
        loader = self._loader
        return Rebatch(
            self._tokens,
            self._budget,
            loader.in_order,
            self._watermark,
            set(self._extra),
            with_index=with_index,
        )

    def _finish(self, builder: PipelineBuilder[Any, Any]) -> PipelineBuilder[Any, Any]:
        mover = BatchMover(self._loader.device, self._loader.pin_memory)
        if mover.active:
            builder.pipe(Tagged(mover, tagged=self._map_style), name="transfer", queue_size=2)
        return builder.add_sink(self._buffer_size())

    def _thread_group(self, threads: int) -> WorkerGroup | None:
        """The worker ids of this epoch's ``threads`` threads (kept across epochs with
        persistent workers, whose threads ran ``worker_init_fn`` once)."""
        group = self._group
        if group is not None and group.num_workers != threads:  # "auto" chose more
            group = self._group = WorkerGroup(
                threads,
                group.base_seed,
                group.dataset,
                self._loader.worker_init_fn,
                group.copy_dataset,
            )
        if self._loader._persistent_executor(threads) is not None and group is not None:
            return self._loader._persistent_group(group)
        return group

    def _buffer_size(self) -> int:
        """The sink's batches: torch's ``prefetch_factor * num_workers`` batches in flight,
        less those the whole-batch paths already hold (a batch per loading thread or worker
        arena, and the settle queue), so that as many large batches exist at once as under
        torch."""
        loader = self._loader
        if loader.buffer_size:
            return loader.buffer_size
        return max((loader.prefetch_factor or 2) * loader.num_workers - self._held, 2)

    def _stage_specs(self, threads: int | None) -> list[_StageSpec]:
        """The per-sample stages, all on threads (``threads`` runs a plain ``__getitem__``)."""
        loader = self._loader
        dataset = loader.dataset
        workers = loader._threads
        if isinstance(dataset, StagedDataset):
            steps = list(dataset.stages())
        else:
            steps = [Stage(dataset.__getitem__, "cpu", name="getitem")]
        pool = loader._persistent_executor(threads or workers)
        group = self._thread_group(threads or workers)
        specs = []
        for step in steps:
            name = step.name or getattr(step.fn, "__name__", "stage")
            floor = None
            if step.concurrency is not None:
                conc: int | str = step.concurrency
            elif step.kind == "io":
                # By default an I/O stage is autotuned, never below the fixed default it
                # had before (docs/autotune.md, "On by default").
                conc = loader.io_concurrency or "auto"
                floor = None if loader.io_concurrency else max(workers, 8)
            else:
                conc = loader.cpu_concurrency or threads or workers
            op = stage_op(step.fn, name, None if _is_async(step.fn) else group)
            executor = None if _is_async(step.fn) else pool
            specs.append(_StageSpec(op, conc, executor, name, step.kind, floor))
        return specs

    # -- consuming -------------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            item = self._get()
        except StopIteration:
            if self._switch():
                return self.__next__()
            self._exhausted = True
            self._close()
            raise
        except TimeoutError as exc:
            self._close()
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from exc
        except PipelineFailure as failure:
            self._close()
            cause = failure.__cause__
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except BaseException:
            self._close()
            raise
        b, batch = item if self._map_style else (None, item)
        if isinstance(batch, BatchError):
            if batch.fatal:
                self._close()
            else:  # the batch is done with (as torch's iterator is): the epoch goes on
                self._delivered(b)
                self._loader.num_failures = self._budget.count
            error = batch.error
            # The traceback keeps this frame: without `self` in it, an error that ends the
            # caller's loop does not keep the epoch (and its workers) running.
            del self, item, batch
            raise error
        self._delivered(b)
        self._loader.num_failures = self._budget.count
        return batch

    def _get(self) -> Any:
        try:
            return self._pipeline.get_item(timeout=self._timeout)
        except EOFError:  # the end, or the stream a failure ended: stop() raises it
            if self._gate is None or self._gate.choice is None:
                self._release()
                self._pipeline.stop(timeout=_ABANDON_S)
            raise StopIteration from None

    def _stop_pipeline(self) -> None:
        """Stop the pipeline; its failure, if any, was raised from ``next()`` already."""
        try:
            self._pipeline.stop(timeout=_ABANDON_S)
        except PipelineFailure:
            pass

    def _switch(self) -> bool:
        """When ``worker_type="auto"`` chose another plan, the probing pipeline has ended:
        the batches it set aside, then the rest of the epoch, go to the new one."""
        gate = self._gate
        if gate is None or gate.choice is None:
            return False
        self._gate = None
        self._record_tuning()
        self._stop_pipeline()  # every thread of the probing pipeline is joined: fork-safe
        # Its collate buffers must be gone before worker processes fork (they would inherit
        # them); a pipeline never started stands in until the next one is built.
        self._pipeline = PipelineBuilder().add_source(()).add_sink(1).build()
        rest: Iterator[tuple[int, list[Any]]] = iter(sorted(gate.deferred))
        if gate.next_batch is not None:
            rest = itertools.chain(rest, self._batches(gate.next_batch))
        self._pipeline = self._build_map(gate.choice, rest).build(max_failures=0)
        return True

    def _delivered(self, b: int | None) -> None:
        if self._loading is not None and b is not None:
            self._loading.delivered(b)  # its arena is the training loop's now
        if b is None or b == self._watermark:
            self._watermark += 1
            while self._watermark in self._extra:
                self._extra.discard(self._watermark)
                self._watermark += 1
        else:
            self._extra.add(b)

    def state_dict(self) -> dict[str, Any]:
        if self._exhausted or self._all_delivered():
            # The epoch is over: what matters is the RNG state the next epoch starts from.
            state = rng_state(self._loader.generator)
            return {"epoch": self._loader._epoch, "rng_state": state, "exhausted": True}
        return {
            "epoch": self._loader._epoch,
            "rng_state": self._rng_state,
            "delivered": self._watermark,
            "extra": sorted(self._extra),
            "exhausted": False,
        }

    def _all_delivered(self) -> bool:
        if not self._map_style:
            return False
        try:
            return self._watermark >= len(self._loader._index_sampler)
        except TypeError:
            return False

    def close(self) -> None:
        """Stop this epoch's pipeline now; the iterator then ends."""
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._record_tuning()
        self._release()
        self._stop_pipeline()
        loader = self._loader
        probe = self._probe
        if probe is not None and not probe.done and loader.worker_choice is None:
            # An epoch too short to decide in: decide for the next one from what it saw.
            measured = probe.final()
            if measured is not None and measured.batches >= probe.min_batches:
                more = loader.worker_init_fn is None
                size = loader.batch_size or 1
                loader._chose(decide(measured, loader.num_workers, size, more_threads=more))

    def _release(self) -> None:
        """Wake whatever the pipeline's threads may wait on outside the pipeline: the
        source's batch tokens, worker processes, iterable worker threads."""
        if self._tokens is not None:
            self._tokens.close()
        persistent = self._loader._process_workers
        if persistent is not None:
            persistent.cancel_pending()  # its threads wait for batches no one will take
        if self._workers is not None:
            self._workers.shutdown()
            self._workers = None
        if self._iterable is not None:
            self._iterable.close()

    def _record_tuning(self) -> None:
        for stats in self._pipeline.get_stats():  # where "auto" stages settled
            if stats.max_concurrency is not None:
                self._loader._tuned[stats.name.split(":", 1)[-1]] = stats.concurrency

    def __del__(self) -> None:
        if hasattr(self, "_pipeline"):
            self._close()


def split_point(dataset: Any, worker_type: str) -> int | None:
    """The first of a staged dataset's stages to run in worker processes (with every stage
    after it), or None when all run on threads: the first declared with
    ``executor="process"``, or with ``worker_type="process"`` the first sync CPU stage."""
    steps = list(dataset.stages())
    for i, step in enumerate(steps):
        if step.executor == "process" or (
            worker_type == "process" and step.kind == "cpu" and not _is_async(step.fn)
        ):
            return i
    return None


def stage_fns(dataset: Any, split: int) -> list[Any]:
    """In a worker process: the functions of the dataset's stages from ``split`` on."""
    return [step.fn for step in list(dataset.stages())[split:]]


def _weakly(method: Any) -> Any:
    """``method``, called only while its object lives (a stage op must not keep the loader
    alive: persistent worker threads are stopped when the loader is collected)."""
    ref = weakref.WeakMethod(method)

    def call(arg: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(arg)

    return call


def _is_async(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    """``first`` then the rest of ``rest``, without calling ``iter(rest)`` again: a batch
    sampler that is its own iterator (Lightning's) restarts when iterated anew."""
    if first is _END:
        return
    yield first
    while (item := next(rest, _END)) is not _END:
        yield item
