"""``torch_spdl.DataLoader``: torch's DataLoader, loaded by a staged pipeline.

The loader is torch's own class (its arguments, validation, ``len()``, ``sampler`` and
``batch_sampler`` are torch's), with ``__iter__`` replaced by an epoch
(:class:`~torch_spdl.data._epoch.epoch.EpochIterator`) that keeps torch's contract by default:
``__getitem__`` runs in ``num_workers`` forked worker processes seeded and fed as torch's
(or inside ``next()`` with ``num_workers=0``), so batches are torch's for the same seed and
the training process is left alone (docs/dataloader.md, "The contract"). What differs is
how batches travel (shared-memory arenas, no pickled tensors) and, for a
:class:`StagedDataset`, its I/O stages on many threads; ``worker_type="thread"`` or
``"auto"`` run ``__getitem__`` on threads as a pipeline, which gives up that contract.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import IterableDataset

from ._epoch.epoch import EpochIterator, set_rng_state
from ._epoch.epoch_plan import EpochPlan, LoaderResources, Loading
from ._epoch.thread_or_process import WorkerChoice
from ._loading.staged_batch import staged_steps
from ._loading.staged_dataset import StagedDataset
from ._loading.worker_info import install_torch_worker_info

__all__ = ["DataLoader"]

_WORKER_TYPES = ("auto", "thread", "process", "ray")


_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(_TorchDataLoader[_T_co]):
    """A drop-in for ``torch.utils.data.DataLoader`` that loads through a staged pipeline.

    Every argument of torch's DataLoader is accepted and validated by torch, and means what
    it means there (docs/torch-differences.md lists what still differs). The extra
    arguments are keyword-only.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``; a
            :class:`StagedDataset` runs its stages with their own concurrency) or an
            ``IterableDataset``.
        batch_size: samples per batch (default 1); None turns automatic batching off, and
            ``collate_fn`` then gets each sample on its own.
        shuffle: draw the indices in a random order each epoch (from ``generator``).
        sampler: the indices to load, in order (excludes ``shuffle``).
        batch_sampler: the batches of indices to load (excludes ``batch_size``,
            ``shuffle``, ``sampler`` and ``drop_last``).
        num_workers: worker processes running ``__getitem__`` (threads with
            ``worker_type="thread"``); 0: loading inside ``next()``, on the calling thread,
            as torch's (one background thread with ``worker_type="thread"``).
        collate_fn: makes a batch from a list of samples (default: torch's
            ``default_collate``, into buffers reused across batches).
        pin_memory: put each batch in pinned memory (when CUDA is available).
        drop_last: drop the last batch when it is short.
        timeout: seconds ``next()`` waits for a batch before raising (0: no limit).
        worker_init_fn: called with the worker id once in each worker process or thread
            as it starts (once per loader with ``persistent_workers``).
        multiprocessing_context: how worker processes are started (a context or its name).
        generator: the RNG of the sampler and of the workers' base seed (default:
            torch's global RNG).
        prefetch_factor: batches in flight per worker (default 2).
        persistent_workers: keep the worker processes or threads across epochs (stopped
            by :meth:`shutdown` or when the loader is collected).
        pin_memory_device: accepted for torch code (torch deprecates it).
        in_order: deliver batches in sampler order (default); False delivers each as soon
            as it is ready.
        worker_type: how ``num_workers`` workers run ``__getitem__``: ``"process"``
            (default) in worker processes as torch's, the same batches for a seed;
            ``"thread"`` on threads of this process (sharing its global RNGs, its GIL and
            its fate in a crash); ``"auto"`` measures the first batches and picks threads,
            or worker processes when the work holds the GIL (the choice is in
            :attr:`worker_choice`; see docs/dataloader.md for what each gives up);
            ``"ray"``: ``num_workers`` Ray actors anywhere in a Ray cluster, each one of
            torch's workers (the same batches for a seed as ``"process"``; see
            docs/distributed.md, "Beyond one machine").
        ray_options: with ``worker_type="ray"``, Ray's actor options for every worker
            (``num_cpus``, default 1; ``num_gpus``, ``memory``, custom ``resources``,
            ``scheduling_strategy`` such as ``"SPREAD"`` or a node affinity, ...), and
            three of the loader's own: ``address`` (the cluster to connect to when this
            process is not connected yet; default Ray's), ``max_replacements`` (actors
            that may die and be replaced in all, default ``2 * num_workers``) and
            ``start_timeout_s`` (how long the actors may take to be placed, default 120).
        io_concurrency: workers of a :class:`StagedDataset`'s ``io`` stages, or ``"auto"``
            (default: autotuned from ``num_workers``, at least 8, up to 64; never below
            where it starts). With worker processes (or Ray actors), each runs a batch's
            ``io`` stages inline until they are seen to wait, then on up to a batch's
            samples of threads; a number here says they wait: its threads from the first
            batch, that many samples at once (docs/dataloader.md).
        cpu_concurrency: workers of its ``cpu`` stages (default ``num_workers``), or
            ``"auto"``.
        collate_concurrency: threads running ``collate_fn`` on the per-sample path
            (default 1), or ``"auto"``. An ``"auto"`` knob is tuned while running (I/O
            stages up to 64 workers, CPU and collate stages up to the cores), within a CPU
            budget of 40% of the machine (docs/autotune.md).
        buffer_size: batches kept ready (default: ``prefetch_factor * num_workers`` less
            one for the batch the training loop holds, and less the batches the loading
            threads, worker arenas and settle queue already hold; at least 1).
        device: move each batch there on a dedicated transfer stage (with ``pin_memory``).
        max_failures: samples that may fail and be skipped (counted in
            :attr:`num_failures`); beyond it, or with the default 0, the error is raised
            from ``next()`` as torch does, with the sample index and the stage in its notes,
            and the epoch goes on.
        per_worker_dataset: with worker threads, give each its own shallow copy of the dataset,
            as each of torch's worker processes has its own (default); False shares one.
        worker_nice: added to a worker process's niceness (``os.nice``) after the first
            batch for which it ran, or waited for a core, half the batch's time or more
            (default 10; 0 leaves it as torch's workers have it): when the training loop
            and a computing worker both want a core, the training loop gets it, and the
            worker loads in what it leaves; a worker that mostly waits (I/O) keeps its
            niceness, and wakes from its waits without queueing behind the training
            threads. Worker threads and the training process are not touched
            (docs/dataloader.md, "Decisions").

    Raises:
        ValueError: for an unknown ``worker_type``, a knob that is not a positive int (or
            ``"auto"`` where allowed), a negative ``max_failures`` or ``worker_nice``, or
            what torch rejects.
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
        io_concurrency: int | Literal["auto"] | None = None,
        cpu_concurrency: int | Literal["auto"] | None = None,
        collate_concurrency: int | Literal["auto"] = 1,
        worker_type: Literal["auto", "thread", "process", "ray"] = "process",
        ray_options: dict[str, Any] | None = None,
        buffer_size: int | None = None,
        device: str | torch.device | None = None,
        max_failures: int = 0,
        per_worker_dataset: bool = True,
        worker_nice: int = 10,
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
        _check_own_knobs(
            worker_type,
            io_concurrency=io_concurrency,
            cpu_concurrency=cpu_concurrency,
            collate_concurrency=collate_concurrency,
            buffer_size=buffer_size,
            max_failures=max_failures,
            worker_nice=worker_nice,
        )
        self.io_concurrency = io_concurrency
        self.cpu_concurrency = cpu_concurrency
        self.collate_concurrency = collate_concurrency
        self.worker_type = worker_type
        self.ray_options = dict(ray_options or {})
        if ray_options and worker_type != "ray":
            raise ValueError("ray_options is for worker_type='ray'")
        self.buffer_size = buffer_size
        self.device = device
        self.max_failures = max_failures
        self.per_worker_dataset = per_worker_dataset
        self.worker_nice = worker_nice
        self.check_worker_number_rationality()
        if worker_type in ("thread", "auto") or (
            worker_type == "process" and isinstance(dataset, StagedDataset)
        ):
            # Loader threads will run user code: torch.utils.data.get_worker_info() must
            # answer in them. Only then is torch's function touched (never by the default,
            # whose workers are processes: the training process stays as torch leaves it).
            install_torch_worker_info()
        self._epoch = -1
        self._resume: dict[str, Any] | None = None
        self._live: weakref.ReferenceType[EpochIterator] | None = None
        choice = None
        if worker_type != "auto" and num_workers > 0:
            threads = worker_type == "thread"
            choice = WorkerChoice(
                "thread" if threads else "process",
                num_workers if threads else 0,
                per_batch=not threads,
                reason=f"worker_type={worker_type!r}",
            )
        # What outlives an epoch: persistent workers, recycled buffers, what was learned.
        self._resources = LoaderResources(choice)

    @property
    def worker_choice(self) -> WorkerChoice | None:
        """How ``__getitem__`` runs: set at once for ``worker_type="thread"``/``"process"``,
        after the first batches of the first epoch for ``"auto"`` (None until then)."""
        return self._resources.worker_choice

    @worker_choice.setter
    def worker_choice(self, choice: WorkerChoice | None) -> None:
        self._resources.worker_choice = choice

    @property
    def num_failures(self) -> int:
        """Samples skipped under ``max_failures`` in the current epoch."""
        return self._resources.num_failures

    @num_failures.setter
    def num_failures(self, count: int) -> None:
        self._resources.num_failures = count

    def check_worker_number_rationality(self) -> None:
        # torch warns when num_workers exceeds the cores; threads waiting on I/O are cheap,
        # so the warning only applies to worker processes.
        if getattr(self, "worker_type", "thread") == "process":  # Ray's actors are elsewhere
            super().check_worker_number_rationality()

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:  # type: ignore[override]
        if not (self.persistent_workers and self.num_workers > 0 and self._epoch >= 0):
            _warn_as_torchs_iterator_does(self.pin_memory, self.pin_memory_device)
        self._epoch += 1
        resume, self._resume = self._resume, None
        iterator = EpochIterator(self._plan(), self._resources, resume)
        self._live = weakref.ref(iterator)
        return iterator

    def _plan(self) -> EpochPlan:
        """This epoch's settings, as they are now."""
        map_style = not isinstance(self.dataset, IterableDataset)
        return EpochPlan(
            epoch=self._epoch,
            dataset=self.dataset,
            map_style=map_style,
            index_sampler=self._index_sampler,
            length=self.__len__,
            generator=self.generator,
            batch_size=self.batch_size,
            auto_collation=self._auto_collation,
            drop_last=self.drop_last,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            worker_type=self.worker_type,
            ray_options=self.ray_options,
            worker_init_fn=self.worker_init_fn,
            per_worker_dataset=self.per_worker_dataset,
            worker_nice=self.worker_nice,
            persistent_workers=self.persistent_workers,
            multiprocessing_context=self.multiprocessing_context,
            prefetch_factor=self.prefetch_factor or 2,
            in_order=self.in_order,
            timeout=self.timeout if self.timeout > 0 else None,
            io_concurrency=self.io_concurrency,
            cpu_concurrency=self.cpu_concurrency,
            collate_concurrency=self.collate_concurrency,
            buffer_size=self.buffer_size,
            device=self.device,
            pin_memory=self.pin_memory,
            max_failures=self.max_failures,
            loading=self._loading() if map_style else None,
            reported_length=None if map_style else self._IterableDataset_len_called,
        )

    def _loading(self) -> Loading:
        """How this epoch loads a map-style dataset (see ``EpochParts.build_map``)."""
        if self.num_workers == 0 and self.worker_type in ("process", "ray"):
            # torch's single-process loading, a StagedDataset's stages included (its
            # __getitem__ runs them in order): no thread draws from the global RNGs
            return "caller"
        if self.worker_type == "ray":  # an actor runs a staged dataset's every stage
            return self.worker_choice or "probe"
        if isinstance(self.dataset, StagedDataset):
            if self.worker_type == "process" and staged_steps(self.dataset) is not None:
                # its io stages first: all its stages run in the workers, which the
                # training process feeds and reads as it does a plain dataset's
                return WorkerChoice(
                    "process", self.num_workers, per_batch=True, reason="a staged dataset"
                )
            return "staged"
        if self.num_workers == 0:
            return "inline"
        if self.worker_type == "thread":
            return WorkerChoice(
                "thread", self.num_workers, per_batch=False, reason="worker_type='thread'"
            )
        return self.worker_choice or "probe"

    def shutdown(self) -> None:
        """Stop persistent workers now (they also stop when the loader is collected)."""
        self._resources.shutdown()

    # -- resumable state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands: restoring it delivers exactly the rest."""
        live = self._live() if self._live is not None else None
        if live is None:
            return {"epoch": self._epoch, "rng_state": None, "delivered": 0, "extra": []}
        return live.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter()`` continues the saved epoch where it stopped (a state
        taken after an epoch ended makes the next ``iter()`` a fresh epoch).

        Args:
            state: what :meth:`state_dict` returned (for this loader's dataset and
                sampler).
        """
        self._resume = None
        if state.get("rng_state") is None:
            return
        if state.get("exhausted"):  # start the next epoch from where the RNG stood
            set_rng_state(self.generator, state["rng_state"])
            return
        self._resume = dict(state)


def _check_own_knobs(
    worker_type: str, *, max_failures: int, worker_nice: int, **concurrency: Any
) -> None:
    """Raise ValueError for a value of the arguments torch does not have that is not
    allowed (the messages name the argument and the value)."""
    if worker_type not in _WORKER_TYPES:
        raise ValueError(
            f"worker_type must be 'auto', 'thread', 'process' or 'ray', got {worker_type!r}"
        )
    for knob, value in concurrency.items():
        if value == "auto" and knob != "buffer_size":
            continue
        if value is not None and (not isinstance(value, int) or value < 1):
            what = "a positive int" if knob == "buffer_size" else "a positive int or 'auto'"
            raise ValueError(f"{knob} must be {what}, got {value!r}")
    if max_failures < 0:
        raise ValueError(f"max_failures must be >= 0, got {max_failures!r}")
    if isinstance(worker_nice, bool) or not isinstance(worker_nice, int) or worker_nice < 0:
        raise ValueError(f"worker_nice must be an int >= 0, got {worker_nice!r}")


def _warn_as_torchs_iterator_does(pin_memory: bool, pin_memory_device: str) -> None:
    """The warnings torch's loader gives as it makes an iterator (every epoch, but once with
    persistent workers, whose iterator torch resets), in its words: a script that passes
    ``pin_memory=True`` on a machine without an accelerator hears what it heard before."""
    if pin_memory and pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_memory_device}'.",
            stacklevel=3,
        )
    if pin_memory and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=3,
        )
