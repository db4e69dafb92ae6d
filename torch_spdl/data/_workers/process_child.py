"""What runs in a DataLoader worker process, and the messages between it and the loader.

:mod:`.process_pool` (the loader's side) forks the workers; each runs :func:`worker_main`:
it takes tasks from its pipe (:class:`LoadBatch`: a batch of indices, or of values the
first stages made on threads; :class:`NextBatch`: an iterable dataset's next batch; the
wire's ``Stop``), loads and collates the batch, writes it into a shared-memory arena and
sends back the batch's small metadata (:class:`BatchWritten`), or the errors of its samples
(:class:`BatchWithErrors`), each as the wire's ``PortableError``. The messages are typed as
the process wire's are, and travel as its do (``torch_spdl._procwire``: plain pickle, by
value); the values and a batch are pickled once more inside them (``payload``, ``data``),
the values before they reach the sender thread, a batch by :func:`dump_batch`.
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import select
import signal
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from ..._procwire import PortableError, Stop, receive, send
from .._loading.collate import PlacingCollate, is_default_collate
from .._loading.fetch import Fetched, IterableFetcher, fetch_batch
from .._loading.staged_batch import StagedBatch
from .._loading.worker_info import install_torch_worker_info, set_process_worker_info
from .arena_leases import NO_ARENA
from .libc import return_large_blocks, share_arenas, trim
from .shared_batch import Arena, BatchSpace, dump_batch
from .worker_priority import Priority

__all__ = [
    "BatchWritten",
    "CancelledTasks",
    "Exhausted",
    "InitFailed",
    "LoadBatch",
    "NextBatch",
    "Reply",
    "BatchWithErrors",
    "Skipped",
    "Task",
    "import_what_workers_import",
    "worker_main",
]

_WATCHDOG_MS = 5000  # how often an idle worker checks that the loader's process still lives


# -- the loader to a worker -----------------------------------------------------------------
class LoadBatch(NamedTuple):
    """Load one batch: ``payload`` is the pickled ``(values, indices)``; the values are
    indices for ``__getitem__`` (``first_stage`` None), or what the stages before
    ``first_stage`` made on threads."""

    task_id: int
    slot: int  # the arena to write the batch into, or NO_ARENA
    payload: bytes
    first_stage: int | None


class NextBatch(NamedTuple):
    """An iterable dataset's next batch: ``payload`` is the pickled ``(epoch, state)``
    (state: a stateful dataset's, to restore first, or None)."""

    task_id: int
    slot: int
    payload: bytes


Task = LoadBatch | NextBatch | Stop


# -- a worker to the loader -----------------------------------------------------------------
class BatchWritten(NamedTuple):
    """A batch, as :func:`dump_batch` wrote it, and the dataset's state after it."""

    task_id: int
    slot: int
    data: bytes
    size: int  # the arena's size (it may have grown)
    used: int  # bytes written into the arena
    state: Any
    inline: bool | None = None  # a staged dataset's loads: decided inline (or not), news


class SampleError(NamedTuple):
    pos: int
    index: Any
    error: PortableError


class BatchWithErrors(NamedTuple):
    """The samples that loaded (written as a batch is) and the errors of those that did not."""

    task_id: int
    slot: int
    data: bytes
    size: int
    used: int
    errors: list[SampleError]


class Exhausted(NamedTuple):
    """An iterable dataset's worker has no more batches this epoch."""

    task_id: int
    slot: int


class Skipped(NamedTuple):
    """A batch the loader cancelled before the worker began it: nothing was loaded."""

    task_id: int
    slot: int


class InitFailed(NamedTuple):
    """The worker could not start (``worker_init_fn`` raised): it exits."""

    error: PortableError


Reply = BatchWritten | BatchWithErrors | Exhausted | Skipped | InitFailed


class CancelledTasks:
    """Which tasks the loader abandoned (its workers are being stopped), in a page it
    shares with its forked workers: a worker skips such a task instead of loading a batch
    nobody will read. Torch's workers skip theirs in the same way once their iterator
    shuts down (its ``done_event``); without it a worker went on through every batch it
    had been handed, and an early ``break`` waited for them (with 16 samples of 10 ms a
    batch and two workers, 337 ms against torch's 174 ms).

    Task ids only grow, and what is cancelled is every id below a bound, so one number
    says it all; it is written by the loader only (an aligned 8-byte store)."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, 8)  # anonymous and shared: the workers forked see it

    def cancel_below(self, task_id: int) -> None:
        """Every task with an id below ``task_id`` is cancelled."""
        if task_id > self.bound():
            self._page[:8] = task_id.to_bytes(8, "little")

    def bound(self) -> int:
        return int.from_bytes(self._page[:8], "little")

    def close(self) -> None:
        self._page.close()


def worker_main(
    wid: int,
    config: tuple[Any, ...],
    stage_fns: Callable[[Any, int], Sequence[Callable[[Any], Any]]] | None,
    tasks: Connection,
    results: Connection,
    arenas: list[Arena] | None,
    cancelled: CancelledTasks | None,
    others: list[Connection],
) -> None:
    dataset, collate_fn, auto_collation, iterable, priority, staged = _become_worker(
        wid, config, results, others
    )
    steps_cache: dict[int, Sequence[Callable[[Any], Any]]] = {}
    fetcher: IterableFetcher | None = None
    parent = os.getppid()
    # One poll object for the worker's life: ``Connection.poll`` builds a selector on every
    # call, a sixth of a worker's py-spy samples on batches of 256 path strings.
    incoming = select.poll()
    incoming.register(tasks.fileno(), select.POLLIN)
    while True:
        try:
            while not incoming.poll(_WATCHDOG_MS):
                if os.getppid() != parent:  # the loader's process is gone
                    os._exit(0)
            task: Task = receive(tasks)
        except (EOFError, OSError):  # the loader's process is gone
            break
        if isinstance(task, Stop):
            break
        if cancelled is not None and task.task_id < cancelled.bound():
            send(results, Skipped(task.task_id, task.slot))  # its arena is free again
            continue
        arena = arenas[task.slot] if arenas is not None and task.slot != NO_ARENA else None
        priority.batch_begins()
        if isinstance(task, NextBatch):
            if fetcher is None:
                assert iterable is not None, "an iterable task for a map-style worker"
                per_batch, drop_last = iterable
                fetcher = IterableFetcher(dataset, per_batch, drop_last, collate_fn, auto_collation)
            epoch, state = pickle.loads(task.payload)
            space = _space(arena, collate_fn, auto_collation)
            placing = PlacingCollate(space.empty) if space is not None else None
            fetched = fetcher.next(epoch, state, collate_fn=placing)
            if fetched is None:
                send(results, Exhausted(task.task_id, task.slot))
            else:
                send(results, _pack(fetched, task.task_id, task.slot, arena, space))
        else:
            values, indices = pickle.loads(task.payload)
            first = task.first_stage
            if first is not None and first not in steps_cache and stage_fns is not None:
                steps_cache[first] = stage_fns(dataset, first)
            steps = steps_cache.get(first) if first is not None else None
            threaded = False  # the loads ran on this worker's threads
            if first is None and staged is not None:
                values, steps = staged.load(values, indices), staged.cpu_steps
                threaded = staged.on_threads
            # Called from this frame, not a helper's: a frame less under every sample
            # (code that walks the stack pays for each: ProcessWorkers.start).
            space = _space(arena, collate_fn, auto_collation)
            collate = PlacingCollate(space.empty) if space is not None else collate_fn
            fetched = fetch_batch(dataset, values, indices, steps, collate, auto_collation)
            reply = _pack(fetched, task.task_id, task.slot, arena, space, indices)
            if staged is not None and isinstance(reply, BatchWritten):
                reply = reply._replace(inline=staged.news())
            send(results, reply)
            if threaded:
                del values, fetched  # what the loads read, freed before the trim
                trim()  # the pages the load threads freed (libc.py)
        priority.batch_ended()
    os._exit(0)  # no atexit handlers or finalizers of the parent's objects in the child


def _become_worker(
    wid: int, config: tuple[Any, ...], results: Connection, others: list[Connection]
) -> tuple[Any, Any, bool, Any, Priority, StagedBatch | None]:
    """Become worker ``wid`` of the loader (seeded, ``get_worker_info()`` set,
    ``worker_init_fn`` run; on its failure, report it and exit); what the loop needs of
    ``config``: the dataset, ``collate_fn``, auto-collation, the iterable's batching, the
    worker's priority and a staged dataset's batches (run here,
    ``_loading/staged_batch.py``)."""
    for conn in others:
        conn.close()
    # The parent's objects are never collected here: no finalizer of theirs runs in the
    # child, and no collection writes to (and so copies) the pages they share with it.
    gc.freeze()
    return_large_blocks()
    share_arenas()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training loop's to handle
    (dataset, num_workers, base_seed, init_fn, collate_fn, auto_collation, iterable, nice, io) = (
        config[:9]
    )
    learned = config[9].get(wid)  # what this worker id decided of its loads last epoch
    threads_first = config[10]  # with nothing learned: loads on the threads (io_concurrency)
    install_torch_worker_info()  # this process is the loader's: collate then sees no worker
    try:
        set_process_worker_info(wid, num_workers, base_seed, dataset)
        if init_fn is not None:
            init_fn(wid)
    except Exception as exc:
        send(results, InitFailed(PortableError.of(exc)))
        os._exit(1)
    priority = Priority(nice)  # raised once a batch shows the worker computes
    staged = StagedBatch.of(dataset, io, learned, threads_first)
    return dataset, collate_fn, auto_collation, iterable, priority, staged


def import_what_workers_import() -> None:
    """Import, once in the loader's process, what every worker imports as it starts, so
    that forked workers inherit it instead of each importing it on the epoch's critical
    path: ``numpy.random``, which NumPy loads lazily and a worker needs to seed NumPy as
    torch's workers do (12-14 ms in each forked worker on 2 cores, 7 ms once here). An
    import changes no state a script sees: the global ``RandomState`` it makes is seeded
    from the OS, as it would be on the script's own first use, and a seeded script
    reseeds it."""
    import numpy.random  # noqa: F401


def _space(
    arena: Arena | None, collate_fn: Callable[[Any], Any], auto_collation: bool
) -> BatchSpace | None:
    """The batch's room in its arena, where torch's collate (the default) stacks large
    tensors straight away: the batch is then written once, where the loader reads it,
    instead of stacked into fresh memory and copied over (for 64 images of 224x224 that
    copy and the fresh pages were a sixth of a streaming worker's time). None for a
    user's ``collate_fn``, whose result is copied as it comes."""
    if arena is None or not auto_collation or not is_default_collate(collate_fn):
        return None
    return BatchSpace(arena)


def _pack(
    fetched: Fetched,
    task_id: int,
    slot: int,
    arena: Arena | None,
    space: BatchSpace | None = None,
    indices: Any = None,
) -> Reply:
    """The reply for a batch: the batch, or, when what it holds does not pickle (a lock, a
    generator, an open file), the error naming its samples, so that the loop sees the cause
    and the worker goes on."""
    try:
        return _dump(fetched, task_id, slot, arena, space)
    except Exception as exc:
        what = "a batch" if indices is None else f"the batch of samples {indices!r}"
        exc.add_note(
            f"torch_spdl.DataLoader: {what} could not be sent back from its worker process: "
            "what collate_fn returns must pickle"
        )
        return _dump(Fetched(samples=[], errors=[(-1, indices, exc)]), task_id, slot, arena)


def _dump(
    fetched: Fetched,
    task_id: int,
    slot: int,
    arena: Arena | None,
    space: BatchSpace | None = None,
) -> Reply:
    if fetched.errors is None:
        return BatchWritten(task_id, slot, *dump_batch(fetched.batch, arena, space), fetched.state)
    errors = [SampleError(pos, index, PortableError.of(exc)) for pos, index, exc in fetched.errors]
    return BatchWithErrors(task_id, slot, *dump_batch(fetched.samples, arena), errors)
