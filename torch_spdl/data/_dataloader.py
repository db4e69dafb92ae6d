"""``torch_spdl.DataLoader``: torch's DataLoader, loaded by a staged pipeline.

The loader is torch's own class (its arguments, validation, ``len()``, ``sampler`` and
``batch_sampler`` are torch's), with ``__iter__`` replaced: each epoch builds a pipeline

    indices -> __getitem__ (or the dataset's stages) -> rebatch -> collate -> [transfer] -> sink

where ``__getitem__`` runs per sample with ``num_workers`` threads (so one slow sample does
not hold a whole batch), samples are regrouped into exactly the batches the batch sampler
chose, and batches come out in sampler order (``in_order=True``) as with torch.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import IterableDataset

from ..pipeline import PipelineBuilder, PipelineFailure
from ._staged import Stage, StagedDataset
from ._transfer import BatchMover
from ._worker import WorkerGroup

__all__ = ["DataLoader"]

_LG = logging.getLogger("torch_spdl.data")


class _Slot:
    """A sample on its way through the stages: which batch, which place, its value."""

    __slots__ = ("batch", "size", "pos", "index", "value", "failed")

    def __init__(self, batch: int, size: int, pos: int, index: Any) -> None:
        self.batch = batch
        self.size = size
        self.pos = pos
        self.index = index
        self.value: Any = index
        self.failed = False

    def __repr__(self) -> str:
        return f"sample(index={self.index!r}, batch={self.batch})"


class _FailureBudget:
    """How many samples may fail and be skipped before the error reaches the caller."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.count = 0
        self._lock = threading.Lock()

    def spend(self) -> bool:
        with self._lock:
            if self.count >= self.allowed:
                return False
            self.count += 1
            return True


def _stage_op(
    fn: Callable[[Any], Any], name: str, budget: _FailureBudget, group: WorkerGroup | None
) -> Callable[[_Slot], Any]:
    """Wrap one step of ``__getitem__`` so it works on slots, names failures, and skips
    within the budget."""

    def fail(slot: _Slot, exc: Exception) -> _Slot:
        if budget.spend():
            _LG.warning("skipped %r: %s stage failed: %r", slot, name, exc)
            slot.failed = True
            return slot
        exc.add_note(f"torch_spdl.DataLoader: stage {name!r} failed on sample index {slot.index!r}")
        raise exc

    if inspect.iscoroutinefunction(fn):

        async def run_async(slot: _Slot) -> _Slot:
            if slot.failed:
                return slot
            try:
                slot.value = await fn(slot.value)
            except Exception as exc:
                return fail(slot, exc)
            return slot

        return run_async

    def run(slot: _Slot) -> _Slot:
        if slot.failed:
            return slot
        if group is not None:
            group.enter()
        try:
            slot.value = fn(slot.value)
        except Exception as exc:
            return fail(slot, exc)
        return slot

    return run


class _Rebatch:
    """Regroups samples into the batches the sampler made (batch number, sample list)."""

    def __init__(self) -> None:
        self._open: dict[int, list[Any]] = {}
        self._filled: dict[int, int] = {}

    def __call__(self, slot: _Slot) -> Iterator[tuple[int, list[Any]]]:
        b = slot.batch
        samples = self._open.setdefault(b, [_SKIPPED] * slot.size)
        if not slot.failed:
            samples[slot.pos] = slot.value
        filled = self._filled[b] = self._filled.get(b, 0) + 1
        if filled == slot.size:
            del self._open[b], self._filled[b]
            yield b, [s for s in samples if s is not _SKIPPED]


_SKIPPED: Any = object()

# Process workers: the dataset is sent once per process, not once per sample.
_PROCESS_DATASET: Any = None


def _install_dataset(dataset: Any) -> None:
    global _PROCESS_DATASET
    _PROCESS_DATASET = dataset


def _getitem_in_process(index: Any) -> Any:
    return _PROCESS_DATASET[index]


class DataLoader(_TorchDataLoader):
    """A drop-in for ``torch.utils.data.DataLoader`` that loads through a staged pipeline.

    Every argument of torch's DataLoader is accepted and validated by torch. ``num_workers``
    becomes the number of threads running ``__getitem__`` (``worker_type="process"`` uses
    processes instead). Extra keyword-only knobs:

    - ``io_concurrency`` / ``cpu_concurrency``: concurrency of a :class:`StagedDataset`'s
      ``io`` and ``cpu`` stages (default: ``num_workers``, at least 1; io at least 8).
    - ``collate_concurrency``: threads running ``collate_fn`` (default 1).
    - ``buffer_size``: batches kept ready (default ``prefetch_factor * num_workers``, min 2).
    - ``device``: move each batch there on a dedicated transfer stage (with ``pin_memory``).
    - ``max_failures``: samples that may fail and be skipped (counted in
      :attr:`num_failures`); beyond it, or with the default 0, the error is raised as torch
      does, with the sample index and the stage named in its notes.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        io_concurrency: int | None = None,
        cpu_concurrency: int | None = None,
        collate_concurrency: int = 1,
        worker_type: Literal["thread", "process"] = "thread",
        buffer_size: int | None = None,
        device: str | torch.device | None = None,
        max_failures: int = 0,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        if worker_type not in ("thread", "process"):
            raise ValueError(f"worker_type must be 'thread' or 'process', got {worker_type!r}")
        for knob, value in (
            ("io_concurrency", io_concurrency),
            ("cpu_concurrency", cpu_concurrency),
            ("collate_concurrency", collate_concurrency),
            ("buffer_size", buffer_size),
        ):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{knob} must be a positive int, got {value!r}")
        if max_failures < 0:
            raise ValueError(f"max_failures must be >= 0, got {max_failures!r}")
        self.io_concurrency = io_concurrency
        self.cpu_concurrency = cpu_concurrency
        self.collate_concurrency = collate_concurrency
        self.worker_type = worker_type
        self.buffer_size = buffer_size
        self.device = device
        self.max_failures = max_failures
        self.num_failures = 0
        self.check_worker_number_rationality()
        self._epoch = -1
        self._resume: dict[str, Any] | None = None
        self._live: weakref.ReferenceType[_EpochIterator] | None = None
        self._executor: Executor | None = None  # persistent workers
        self._executor_finalizer: weakref.finalize | None = None
        self._group: WorkerGroup | None = None

    def check_worker_number_rationality(self) -> None:
        # torch warns when num_workers exceeds the cores; threads waiting on I/O are cheap,
        # so the warning only applies to worker processes.
        if getattr(self, "worker_type", "thread") == "process":
            super().check_worker_number_rationality()

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> _EpochIterator:  # type: ignore[override]
        self._epoch += 1
        resume, self._resume = self._resume, None
        iterator = _EpochIterator(self, resume)
        self._live = weakref.ref(iterator)
        return iterator

    @property
    def _threads(self) -> int:
        return max(self.num_workers, 1)

    def _persistent_executor(self) -> Executor | None:
        """The pool that outlives epochs when ``persistent_workers=True``."""
        if not self.persistent_workers:
            return None
        if self._executor is None:
            if self.worker_type == "process":
                self._executor = ProcessPoolExecutor(
                    self.num_workers, initializer=_install_dataset, initargs=(self.dataset,)
                )
            else:
                self._executor = ThreadPoolExecutor(
                    self.num_workers, thread_name_prefix="torch_spdl-worker"
                )
            self._executor_finalizer = weakref.finalize(
                self, self._executor.shutdown, wait=True, cancel_futures=True
            )
        return self._executor

    def _persistent_group(self, first: WorkerGroup) -> WorkerGroup:
        """Persistent workers keep their ids (and ran ``worker_init_fn`` once)."""
        if self._group is None:
            self._group = first
        return self._group

    def shutdown(self) -> None:
        """Stop persistent workers now (they also stop when the loader is collected)."""
        if self._executor_finalizer is not None:
            self._executor_finalizer()
            self._executor = None
            self._executor_finalizer = None

    # -- resumable state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands: restoring it delivers exactly the rest."""
        live = self._live() if self._live is not None else None
        if live is None:
            return {"epoch": self._epoch, "rng_state": None, "delivered": 0, "extra": []}
        return live.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` continues the saved epoch where it stopped."""
        if state.get("rng_state") is None:
            return
        self._resume = dict(state)


class _EpochIterator:
    """One epoch: builds and owns its pipeline; tracks which batches were delivered."""

    def __init__(self, loader: DataLoader, resume: dict[str, Any] | None) -> None:
        self._loader = loader
        self._map_style = not isinstance(loader.dataset, IterableDataset)
        gen = loader.generator
        if resume is not None:  # replay the epoch's random draws
            if gen is not None:
                gen.set_state(resume["rng_state"])
            else:
                torch.set_rng_state(resume["rng_state"])
        self._rng_state = gen.get_state() if gen is not None else torch.get_rng_state()
        self._watermark = resume["delivered"] if resume else 0  # batches [0, w) delivered
        self._extra: set[int] = set(resume["extra"]) if resume else set()
        self._skipped_iterable = 0
        if self._map_style:
            indices = iter(loader._index_sampler)
        # torch draws the workers' base seed from the same generator, after the sampler
        # iterator is made; doing the same keeps the sampler's draws identical to torch's.
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
        if self._map_style:
            first = next(indices, _SKIPPED)  # draw the sampler's seed now, in this thread
            source: Any = _slots(
                _chain(first, indices), loader._auto_collation, self._watermark, set(self._extra)
            )
        else:
            source = iter(loader.dataset)
        self._group = WorkerGroup(loader._threads, base_seed, loader.dataset, loader.worker_init_fn)
        self._budget = _FailureBudget(loader.max_failures - loader.num_failures)
        self._owned_pools: list[Executor] = []
        self._pipeline = self._build(source).build(max_failures=0)
        self._iter = iter(self._pipeline)

    # -- the pipeline ----------------------------------------------------------------------
    def _build(self, source: Any) -> PipelineBuilder[Any, Any]:
        loader = self._loader
        ordered = "input" if loader.in_order else "completion"
        builder = PipelineBuilder().add_source(source)
        if self._map_style:
            for stage in self._stages():
                builder.pipe(
                    stage.op,
                    concurrency=stage.concurrency,
                    executor=stage.executor,
                    output_order=ordered,
                    name=stage.name,
                )
            builder.pipe(_Rebatch(), name="rebatch")
        elif loader._auto_collation:
            builder.aggregate(loader.batch_size, drop_last=loader.drop_last)
        collate = _Collate(loader.collate_fn, loader._auto_collation, tagged=self._map_style)
        builder.pipe(
            collate, concurrency=loader.collate_concurrency, output_order=ordered, name="collate"
        )
        mover = BatchMover(loader.device, loader.pin_memory)
        if mover.active:
            builder.pipe(_Tagged(mover), name="transfer")
        buffer = loader.buffer_size or max((loader.prefetch_factor or 2) * loader.num_workers, 2)
        return builder.add_sink(buffer)

    def _stages(self) -> list[_StageSpec]:
        loader = self._loader
        dataset = loader.dataset
        workers = loader._threads
        if isinstance(dataset, StagedDataset):
            steps = list(dataset.stages())
        elif loader.worker_type == "process":
            steps = [Stage(_getitem_in_process, "cpu", name="getitem", executor="process")]
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
            if inspect.iscoroutinefunction(step.fn):  # runs on the pipeline's event loop
                specs.append(
                    _StageSpec(_stage_op(step.fn, name, self._budget, None), conc, None, name)
                )
            elif step.executor == "process" or loader.worker_type == "process":
                pool = loader._persistent_executor() or self._process_pool(conc)
                specs.append(_StageSpec(_ProcessStep(step.fn, name), conc, pool, name))
            else:
                pool = loader._persistent_executor()
                group = loader._persistent_group(self._group) if pool else self._group
                op = _stage_op(step.fn, name, self._budget, group)
                specs.append(_StageSpec(op, conc, pool, name))
        return specs

    def _process_pool(self, workers: int) -> Executor:
        pool = ProcessPoolExecutor(
            workers, initializer=_install_dataset, initargs=(self._loader.dataset,)
        )
        self._owned_pools.append(pool)
        return pool

    # -- consumer side ---------------------------------------------------------------------
    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        try:
            item = next(self._iter)
        except PipelineFailure as failure:
            self._close()
            cause = failure.__cause__
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except BaseException:
            self._close()
            raise
        if not self._map_style:
            self._watermark += 1
            return item
        b, batch = item
        if b == self._watermark:
            self._watermark += 1
            while self._watermark in self._extra:
                self._extra.discard(self._watermark)
                self._watermark += 1
        else:
            self._extra.add(b)
        self._loader.num_failures = self._loader.max_failures - (
            self._budget.allowed - self._budget.count
        )
        return batch

    def __len__(self) -> int:
        return len(self._loader)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._loader._epoch,
            "rng_state": self._rng_state,
            "delivered": self._watermark,
            "extra": sorted(self._extra),
        }

    def _close(self) -> None:
        pipeline = getattr(self, "_pipeline", None)
        if pipeline is not None:
            pipeline.stop()
        for pool in getattr(self, "_owned_pools", ()):
            pool.shutdown(wait=True, cancel_futures=True)
        self._owned_pools = []

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:
            pass


class _StageSpec:
    __slots__ = ("op", "concurrency", "executor", "name")

    def __init__(self, op: Any, concurrency: int, executor: Executor | None, name: str) -> None:
        self.op = op
        self.concurrency = concurrency
        self.executor = executor
        self.name = name


class _ProcessStep:
    """A step run in a worker process: picklable, so ``fn`` must be too."""

    def __init__(self, fn: Callable[[Any], Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def __call__(self, slot: _Slot) -> _Slot:
        try:
            slot.value = self.fn(slot.value)
        except Exception as exc:
            exc.add_note(
                f"torch_spdl.DataLoader: stage {self.name!r} failed on sample index "
                f"{slot.index!r} (in a worker process)"
            )
            raise
        return slot


class _Tagged:
    """Applies ``fn`` to the batch of a ``(batch number, batch)`` pair."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, tagged: Any) -> Any:
        if isinstance(tagged, tuple) and len(tagged) == 2 and isinstance(tagged[0], int):
            return tagged[0], self.fn(tagged[1])
        return self.fn(tagged)


class _Collate:
    """``collate_fn`` as a stage; names the batch when it fails."""

    def __init__(self, collate_fn: Callable[[Any], Any], auto: bool, tagged: bool) -> None:
        self.collate_fn = collate_fn
        self.auto = auto
        self.tagged = tagged

    def __call__(self, item: Any) -> Any:
        b, samples = item if self.tagged else (None, item)
        try:
            batch = self.collate_fn(samples if self.auto or not self.tagged else samples[0])
        except Exception as exc:
            where = f" on batch {b}" if b is not None else ""
            exc.add_note(f"torch_spdl.DataLoader: stage 'collate' failed{where}")
            raise
        return (b, batch) if self.tagged else batch


def _slots(
    chosen: Iterator[Any], auto_collation: bool, done: int, skip: set[int]
) -> Iterator[_Slot]:
    """Per-sample slots for every batch not yet delivered (batches ``< done`` and ``skip``
    were delivered before a restore: their samples are never read again)."""
    for b, indices in enumerate(chosen):
        if b < done or b in skip:
            continue
        if auto_collation:
            size = len(indices)
            for pos, index in enumerate(indices):
                yield _Slot(b, size, pos, index)
        else:
            yield _Slot(b, 1, 0, indices)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    if first is _SKIPPED:
        return
    yield first
    yield from rest
