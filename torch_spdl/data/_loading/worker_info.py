"""Worker identity for loader threads: torch's ``get_worker_info()``, per thread.

torch keeps worker information in a module global, which works because each worker is a
process. Loader workers here are threads of one process, so the information lives in a
``threading.local``; each worker thread gets an id, a seed (``base_seed + id``, as torch
computes it) and its own random generators, and ``worker_init_fn`` runs once in it before
its first sample, all without touching the global RNG.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import random
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "WorkerInfo",
    "get_worker_info",
    "WorkerGroup",
    "set_process_worker_info",
    "hidden_worker_info",
    "install_torch_worker_info",
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
_LG = logging.getLogger("torch_spdl.data")


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


def _reseeds_process(fn: Callable[[int], None] | None) -> bool:
    """Lightning's ``pl_worker_init_function`` (what ``seed_everything(workers=True)``
    attaches) reseeds the process-wide RNGs: right in a worker process, wrong in a thread
    of the training process, whose RNGs it would reseed mid-run."""
    target = getattr(fn, "func", fn)
    return getattr(target, "__name__", "") == "pl_worker_init_function" and getattr(
        target, "__module__", ""
    ).startswith(("lightning", "pytorch_lightning"))


class WorkerGroup:
    """Hands out worker ids to the threads of one loader epoch (or of persistent workers).

    Each worker thread gets its own shallow copy of the dataset (``copy_dataset``), as each
    of torch's worker processes gets its own (copy-on-write) one: state that
    ``worker_init_fn`` or ``__getitem__`` *assigns* on it (a file handle, a connection, a
    generator) is the thread's own. What the copy shares with the original is what a
    shallow copy shares: the objects its attributes refer to (lists, arrays, tensors),
    which are read in place rather than copied, and which an in-place change (appending to
    ``self.cache``, say) changes for every worker."""

    def __init__(
        self,
        num_workers: int,
        base_seed: int,
        dataset: Any,
        init_fn: Callable[[int], None] | None,
        *,
        copy_dataset: bool = True,
    ) -> None:
        self.num_workers = num_workers
        self.base_seed = base_seed
        self.dataset = dataset
        self.copy_dataset = copy_dataset
        # Worker threads are seeded through their WorkerInfo generators instead.
        self.init_fn = None if _reseeds_process(init_fn) else init_fn
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def enter(self, wid: int | None = None) -> None:
        """Make sure the calling thread is a worker of this group (cheap after the first),
        with the next free id, or ``wid``."""
        if getattr(_LOCAL, "group", None) is self:
            return
        from torch.utils.data._utils import worker as torch_worker

        if wid is None:
            with self._lock:
                n = next(self._ids)
            # Ids stay below num_workers, as torch's do (the threads that replace others
            # when "auto" switches, or the extra threads of waiting work, reuse them), and
            # the seeds stay distinct: no two threads draw the same stream.
            wid = n % self.num_workers if self.num_workers else n
            seed = (self.base_seed + n) % 2**63
        else:
            seed = (self.base_seed + wid) % 2**63
        dataset = _copy(self.dataset) if self.copy_dataset else self.dataset
        _LOCAL.group = self
        _LOCAL.dataset = dataset
        _LOCAL.bound = {}
        _LOCAL.info = _make_info(wid, self.num_workers, seed, dataset)
        _LOCAL.torch_info = torch_worker.WorkerInfo(
            id=wid, num_workers=self.num_workers, seed=seed, dataset=dataset
        )
        if self.init_fn is not None:
            self.init_fn(wid)

    def local(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn``, bound to this thread's copy when it is a method of the dataset."""
        bound = _LOCAL.bound
        local = bound.get(fn)
        if local is None:
            local = bound[fn] = _rebind(fn, self.dataset, _LOCAL.dataset)
        return local

    def local_dataset(self) -> Any:
        """The calling worker thread's dataset."""
        return _LOCAL.dataset


def _copy(dataset: Any) -> Any:
    try:
        return copy.copy(dataset)
    except Exception as exc:  # an object that refuses copying is shared, and said so
        _LG.warning(
            "torch_spdl.DataLoader: worker threads share the dataset (copy.copy(%s) failed: %s)",
            type(dataset).__qualname__,
            exc,
        )
        return dataset


def _rebind(fn: Callable[[Any], Any], original: Any, copy_: Any) -> Callable[[Any], Any]:
    if copy_ is not original and getattr(fn, "__self__", None) is original:
        return types.MethodType(fn.__func__, copy_)  # type: ignore[attr-defined]
    return fn


# -- torch's own get_worker_info(), per thread -------------------------------------------------
_HIDDEN: Any = object()


def _torch_view() -> Any:
    """What torch's ``get_worker_info()`` should say in the calling thread: its torch
    ``WorkerInfo`` in a loader thread, ``_HIDDEN`` while our collate runs (torch's
    ``default_collate`` would then allocate every batch in shared memory, which only a
    worker *process* needs), None elsewhere (torch's own answer then stands)."""
    if getattr(_LOCAL, "collating", False):
        return _HIDDEN
    return getattr(_LOCAL, "torch_info", None)


# The globals that the code of ``_torch_get_worker_info`` reads. That code runs as the
# body of torch's ``get_worker_info``, so there it reads them from torch's worker module
# (``_worker_info`` is torch's own global, the other two are set there by
# ``install_torch_worker_info``). They have the same meaning here, so the function also
# answers correctly if called from this module, and its names are real, typed globals.
_torch_spdl_view: Callable[[], Any] = _torch_view
_torch_spdl_hidden: Any = _HIDDEN
_worker_info: Any = None  # torch's answer outside a worker process


def _torch_get_worker_info() -> Any:  # its code replaces the body of torch's function
    info = _torch_spdl_view()
    if info is None:
        return _worker_info
    return None if info is _torch_spdl_hidden else info


def install_torch_worker_info() -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer per thread.

    torch keeps the worker information in a module global, which suits processes. The
    function object every caller reaches (``torch.utils.data.get_worker_info``, however it
    was imported) keeps its identity; only its body is replaced by one that asks this
    module for the calling thread's answer first. Outside loader threads torch's answer
    (its global: ``None``, or the info in a worker process) is returned unchanged.

    Why the body, and nothing less. Each way that leaves torch's function object alone
    fails a case scripts rely on: setting torch's global (``_worker_info``) around a
    loader thread's work is process-wide, so concurrent loader threads would read each
    other's ids and the training loop would see itself as a worker; a stand-in object as
    that global cannot answer ``None`` outside a worker (``get_worker_info() is None`` is
    how code tells the training process); rebinding the module attributes
    (``torch.utils.data.get_worker_info = ...``) misses every
    ``from torch.utils.data import get_worker_info`` made before the loader, the usual
    form at the top of a dataset's module, which would then answer ``None`` in loader
    threads and leave an ``IterableDataset`` unsharded (every worker reading the whole
    stream). The swap is done once per process, and in the training process only when
    loader threads will run user code: a loader of worker processes and a plain dataset
    leaves it as torch made it."""
    from torch.utils.data._utils import worker as torch_worker

    if getattr(torch_worker, "_torch_spdl_view", None) is not None:
        return
    torch_worker._torch_spdl_view = _torch_view  # type: ignore[attr-defined]
    torch_worker._torch_spdl_hidden = _HIDDEN  # type: ignore[attr-defined]
    torch_worker.get_worker_info.__code__ = _torch_get_worker_info.__code__


@contextlib.contextmanager
def hidden_worker_info() -> Iterator[None]:
    """Around a collate on a loader thread or process: torch's collate sees no worker."""
    _LOCAL.collating = True
    try:
        yield
    finally:
        _LOCAL.collating = False
