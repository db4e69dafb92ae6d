"""One epoch of a DataLoader: builds and owns its pipeline, tracks what was delivered."""

from __future__ import annotations

import itertools
import multiprocessing as mp
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from ..pipeline import PipelineBuilder, PipelineFailure
from ..pipeline._autotune import DEFAULT_MAX_THREADS, cpu_count
from ._collate import is_default_collate
from ._sampling import index_batches
from ._staged import Stage, StagedDataset
from ._stages import (
    BatchError,
    Collate,
    FailureBudget,
    ProcessStep,
    Rebatch,
    RebatchCollate,
    Tagged,
    Tokens,
    load_inline,
    slots,
    stage_op,
)
from ._transfer import BatchMover
from ._worker import WorkerGroup, getitem_in_process, init_process_worker

if TYPE_CHECKING:
    from ._dataloader import DataLoader

__all__ = ["EpochIterator"]

_END: Any = object()


class _StageSpec:
    __slots__ = ("op", "concurrency", "executor", "name", "kind")

    def __init__(
        self, op: Any, concurrency: int | str, executor: Executor | None, name: str, kind: str
    ) -> None:
        self.op = op
        self.concurrency = concurrency  # or "auto"
        self.executor = executor
        self.name = name
        self.kind = kind  # "io" or "cpu": what bounds an autotuned stage


def _bound(concurrency: int | str, kind: str) -> int:
    """A stage's concurrency, or for ``"auto"`` the most it may grow to: I/O stages wait,
    so they may have many workers; CPU stages gain nothing beyond the cores."""
    if concurrency != "auto":
        return int(concurrency)
    return DEFAULT_MAX_THREADS if kind == "io" else cpu_count()


def _auto(concurrency: int | str, kind: str, start: int | None = None) -> dict[str, Any]:
    """``pipe`` keywords bounding an autotuned stage (none for a fixed one), starting it at
    ``start`` (where it ended the epoch before) when known."""
    if concurrency != "auto":
        return {}
    most = _bound("auto", kind)
    kw: dict[str, Any] = {"max_concurrency": most}
    if start is not None:
        kw["initial_concurrency"] = max(1, min(start, most))
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
        self._owned_pools: list[Executor] = []
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
            WorkerGroup(loader.num_workers, self._base_seed, loader.dataset, loader.worker_init_fn)
            if loader.num_workers > 0
            else None
        )
        if self._map_style:
            first = next(indices, _END)  # the sampler's own draws happen now, in this thread
            self._tokens: Tokens | None = Tokens(self._token_count())
            source: Any = slots(
                _chain(first, indices),
                loader._auto_collation,
                self._watermark,
                set(self._extra),
                self._tokens,
            )
        else:
            self._tokens = None
            source = self._iterable_source()
        self._pipeline = self._build(source).build(max_failures=0)
        self._timeout = loader.timeout if loader.timeout > 0 else None
        # The pipeline starts at the first next(), as torch's single-process iterator does:
        # code that calls iter() twice on a loader whose batch sampler is its own iterator
        # (Lightning's predict loop does) must not have the unused first epoch pull from it.
        self._iter = self._pipeline.get_iterator(timeout=self._timeout)

    # -- building --------------------------------------------------------------------------
    def _iterable_source(self) -> Iterator[Any]:
        loader = self._loader
        samples = iter(loader.dataset)
        if self._watermark:  # an IterableDataset can only be skipped by reading it again
            per_batch = loader.batch_size if loader._auto_collation else 1
            samples = itertools.islice(samples, self._watermark * per_batch, None)
        return samples

    def _token_count(self) -> int:
        """Batches in flight before rebatch: enough to keep every worker of every stage busy."""
        workers = sum(_bound(spec.concurrency, spec.kind) for spec in self._stage_specs(dry=True))
        loader = self._loader
        per_batch = loader.batch_size if loader._auto_collation and loader.batch_size else 1
        return -(-workers // per_batch) + 2

    def _build(self, source: Any) -> PipelineBuilder[Any, Any]:
        loader = self._loader
        cc = loader.collate_concurrency
        cc_max = _bound(cc, "cpu")  # "auto": the most collate workers it may grow to
        tuned = loader._tuned
        ordered = "input" if loader.in_order else "completion"
        collate_fn = loader.collate_fn
        if is_default_collate(collate_fn):
            # buffers in use: the sink, the collate workers, the consumer's batch, one spare
            collate_fn = loader._recycling_collate(self._buffer_size() + cc_max + 2)
        collate = Collate(collate_fn, loader._auto_collation, tagged=self._map_style)
        # Queues of batches hold just enough for their stage's workers: batches are large.
        batch_queue = (min(cc_max, 4) if cc == "auto" else cc_max) + 1
        if not self._map_style:
            builder = PipelineBuilder().add_source(source)
            if loader._auto_collation:
                builder.aggregate(loader.batch_size, drop_last=loader.drop_last)
            builder.pipe(
                collate,
                concurrency=cc,
                output_order=ordered,
                name="collate",
                **_auto(cc, "cpu", tuned.get("collate")),
            )
        else:
            assert self._tokens is not None
            rebatch = Rebatch(
                self._tokens, self._budget, loader.in_order, self._watermark, set(self._extra)
            )
            specs = self._stage_specs()
            inline = (
                loader.num_workers == 0
                and loader.worker_type == "thread"
                and not isinstance(loader.dataset, StagedDataset)
            )
            if inline:
                fused = RebatchCollate(rebatch, collate)
                builder = PipelineBuilder().add_source(load_inline(source, specs[0].op, fused))
            else:
                builder = PipelineBuilder().add_source(source)
                for spec in specs:  # completion order: rebatch restores the order
                    builder.pipe(
                        spec.op,
                        concurrency=spec.concurrency,
                        executor=spec.executor,
                        name=spec.name,
                        **_auto(spec.concurrency, spec.kind, tuned.get(spec.name)),
                    )
                if cc == 1:
                    builder.pipe(RebatchCollate(rebatch, collate), name="rebatch+collate")
                else:
                    builder.pipe(rebatch, name="rebatch")
                    builder.pipe(
                        collate,
                        concurrency=cc,
                        **_auto(cc, "cpu", tuned.get("collate")),
                        output_order=ordered,
                        name="collate",
                        queue_size=batch_queue,
                    )
        mover = BatchMover(loader.device, loader.pin_memory)
        if mover.active:
            builder.pipe(Tagged(mover, tagged=self._map_style), name="transfer", queue_size=2)
        return builder.add_sink(self._buffer_size())

    def _buffer_size(self) -> int:
        loader = self._loader
        return loader.buffer_size or max((loader.prefetch_factor or 2) * loader.num_workers, 2)

    def _stage_specs(self, dry: bool = False) -> list[_StageSpec]:
        loader = self._loader
        dataset = loader.dataset
        workers = loader._threads
        if isinstance(dataset, StagedDataset):
            steps = list(dataset.stages())
        elif loader.worker_type == "process":
            steps = [Stage(getitem_in_process, "cpu", name="getitem", executor="process")]
        else:
            steps = [Stage(dataset.__getitem__, "cpu", name="getitem")]
        specs = []
        for step in steps:
            name = step.name or getattr(step.fn, "__name__", "stage")
            if step.concurrency is not None:
                conc = step.concurrency
            elif step.kind == "io":
                conc = loader.io_concurrency or max(workers, 8)
            else:
                conc = loader.cpu_concurrency or workers
            if dry:
                specs.append(_StageSpec(None, conc, None, name, step.kind))
            elif _is_async(step.fn):  # runs on the pipeline's event loop
                specs.append(_StageSpec(stage_op(step.fn, name, None), conc, None, name, step.kind))
            elif step.executor == "process" or loader.worker_type == "process":
                # "auto" tunes the items in flight; the processes stay num_workers
                size = max(loader.num_workers, 1) if conc == "auto" else int(conc)
                pool = loader._persistent_executor(self._base_seed) or self._process_pool(size)
                specs.append(_StageSpec(ProcessStep(step.fn, name), conc, pool, name, step.kind))
            else:
                pool = loader._persistent_executor(self._base_seed)
                group = loader._persistent_group(self._group) if pool else self._group
                specs.append(
                    _StageSpec(stage_op(step.fn, name, group), conc, pool, name, step.kind)
                )
        return specs

    def _process_pool(self, workers: int) -> Executor:
        pool = make_process_pool(self._loader, workers, self._base_seed)
        self._owned_pools.append(pool)
        return pool

    # -- consuming -------------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            item = next(self._iter)
        except StopIteration:
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
            self._close()
            raise batch.error
        self._delivered(b)
        self._loader.num_failures = self._budget.count
        return batch

    def _delivered(self, b: int | None) -> None:
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
        if self._tokens is not None:
            self._tokens.close()
        for stats in self._pipeline.get_stats():  # where "auto" stages settled
            if stats.max_concurrency is not None:
                self._loader._tuned[stats.name.split(":", 1)[-1]] = stats.concurrency
        self._pipeline.stop()
        for pool in self._owned_pools:
            pool.shutdown(wait=True, cancel_futures=True)
        self._owned_pools = []

    def __del__(self) -> None:
        if hasattr(self, "_pipeline"):
            self._close()


def make_process_pool(loader: DataLoader, workers: int, base_seed: int) -> ProcessPoolExecutor:
    """Worker processes that hold the dataset and were initialised as torch's are."""
    ctx = loader.multiprocessing_context
    if ctx is None or isinstance(ctx, str):
        ctx = mp.get_context(ctx)
    return ProcessPoolExecutor(
        workers,
        mp_context=ctx,
        initializer=init_process_worker,
        initargs=(loader.dataset, ctx.Value("i", 0), workers, base_seed, loader.worker_init_fn),
    )


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
