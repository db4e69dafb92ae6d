"""Worker processes that load whole batches, as torch's do, for work that holds the GIL.

A ``__getitem__`` that spends its time in Python (tokenising, parsing, many small array
ops) runs no faster on more threads: the GIL lets one run at a time. Processes run it in
parallel, but a process boundary per *sample* costs hundreds of microseconds and a pickle
each way. So a worker here does what torch's worker does: it takes a batch of indices (or,
after a staged dataset's I/O stage ran on threads, a batch of loaded values), runs
``__getitem__`` (or ``__getitems__``, or the remaining stages) on each, collates the batch
itself and hands it back through a shared-memory arena (:mod:`.shared_batch`), which the
batch then views until it is freed (:mod:`.arena_leases`). Only the indices and the batch's
small metadata are pickled.

Batch ``b`` goes to worker ``b % num_workers``, which runs its batches in order, as torch
assigns them: a dataset drawing random numbers in its workers (seeded ``base_seed +
worker_id``, as torch seeds them) makes torch's batches.

The workers are forked (Linux's default, as with torch: the dataset is not pickled) when
the pool's owner starts it (:meth:`ProcessWorkers.start`, from as few frames as it can),
by the thread that iterates the loader, before the epoch's pipeline starts any thread. A
fork copies only the calling thread, and the child runs only the dataset, the collate
function and :mod:`.process_child`'s loop, so a lock another thread held then is never
needed in it. Each child closes its siblings' pipes, so that its parent's death reaches it
as the end of its pipe; any worker may write a batch into any of the loader's arenas.

Results are read by one wait on every worker's pipe and exit at once (``Watch``,
``torch_spdl._procwire``): a worker that dies (killed, ``os._exit``, a crash in C) fails the
batches it held with an error that names it. That wait runs on a receiver thread when the
batches feed a pipeline, or, with ``receiver=False``, in the thread that asks for a batch
(:meth:`ProcessWorkers.result`), as torch reads results inside ``next()``: a thread woken by
every batch takes a core from the training step (2 cores, a small CNN training on 256 path
strings a batch: 24k samples/s with the receiving and settling threads, 28k without).

Tasks go the other way through :mod:`.worker_outbox`'s one sender thread (why, measured, is
there). After an epoch's last batch is sent (:meth:`ProcessWorkers.no_more_tasks`), each
worker exits once done, so that its exit (unmapping what it shared, about 10 ms on 2
cores) overlaps the training loop's last steps, not the epoch's end.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from ..._procwire import Child, Watch, dumps, receive
from .._loading.fetch import Fetched
from .arena_leases import NO_ARENA, ArenaLeases
from .process_child import (
    BatchWithErrors,
    CancelledTasks,
    Exhausted,
    InitFailed,
    LoadBatch,
    NextBatch,
    Reply,
    Skipped,
    import_what_workers_import,
    worker_main,
)
from .shared_batch import Arena, load_batch
from .worker_outbox import Outbox
from .worker_record import WorkerRecord, died

__all__ = ["ProcessWorkers"]

_GRACE_S = 0.5  # how long a worker that was told to stop may take before it is killed
_HELD_BATCHES = 2  # arenas beyond the bound for the batches the training loop holds
_WARM_ARENAS = 1  # arenas that keep their pages between batches (see arena_leases)
_WARM_BYTES = 4 << 20  # ...and only an arena of at most this size (a batch torch would not hold)


class ProcessWorkers:
    """``num_workers`` forked processes, each holding the dataset, loading batches.

    Args:
        dataset: the dataset (inherited by the fork, pickled with another start method).
        num_workers: how many processes.
        base_seed: worker ``i`` is seeded with ``base_seed + i``, as torch does.
        worker_init_fn: run in each worker with its id after seeding, as torch does.
        collate_fn: collates each batch inside the worker.
        auto_collation: whether a task is a batch of indices (else one index).
        in_flight: batches each worker may hold at once (torch's ``prefetch_factor``).
        mp_context: a multiprocessing context or its name (default: the platform's).
        stage_fns: resolves the dataset's stages in a worker (see :func:`worker_steps`).
        iterable: an ``IterableDataset``'s ``(batch_size, drop_last)``, or None.
        receiver: read results on a receiver thread (for a pipeline); False: in the thread
            that calls :meth:`result`, which then never blocks on a free arena either.
        nice: added to a worker's niceness once a batch shows it computes (when and why:
            :mod:`.worker_priority`).
        io_threads: samples of a staged batch whose ``io`` stages a worker runs at once.
        learned: by worker id, its last decision on a staged dataset's loads (the loader's).
        io_threads_first: with nothing learned, start them on the threads, not inline.
    """

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        base_seed: int,
        worker_init_fn: Callable[[int], None] | None,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
        in_flight: int,
        mp_context: Any = None,
        stage_fns: Callable[[Any, int], Sequence[Callable[[Any], Any]]] | None = None,
        iterable: tuple[int | None, bool] | None = None,
        receiver: bool = True,
        nice: int = 0,
        io_threads: int = 16,
        learned: dict[int, bool] | None = None,
        io_threads_first: bool = False,
    ) -> None:
        ctx = mp_context
        if ctx is None or isinstance(ctx, str):
            ctx = mp.get_context(ctx)
        shared = ctx.get_start_method() == "fork"
        if shared:
            import_what_workers_import()
        self.num_workers = num_workers
        self._workers = [WorkerRecord(i) for i in range(num_workers)]
        self._pending: dict[int, tuple[Future[Fetched | None], WorkerRecord, int]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._discarded: dict[int, int] = {}  # task -> arena, of batches no one waits for
        # Neither holds `self`: the finalizers of batches the training loop keeps hold them.
        arenas: list[Arena] = []
        cool = functools.partial(_cool, arenas)
        self._leases = ArenaLeases(
            in_flight * num_workers, _HELD_BATCHES, _WARM_ARENAS, cool,
            keeps_warm=lambda slot: arenas[slot].size <= _WARM_BYTES,
        )
        arenas.extend(Arena() for _ in range(self._leases.count if shared else 0))
        self._arenas = arenas if shared else None
        self._cancelled = CancelledTasks() if shared else None
        self._closed = False
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        config = (
            dataset, num_workers, base_seed, worker_init_fn, collate_fn, auto_collation,
            iterable, nice, io_threads, dict(learned or {}), io_threads_first,
        )
        self._learned = learned if learned is not None else {}
        self._watch: Watch[WorkerRecord] = Watch(self._wake_r)
        for w in self._workers:
            # Every pipe end but this worker's own two (its parent's end of its task pipe
            # among them: held open in the child, the parent's death would go unnoticed).
            others = [self._wake_r, self._wake_w, w.tasks, w.results]
            others += [
                end
                for o in self._workers
                if o is not w
                for end in (o.tasks, o.results, *o.child_ends)
            ]
            args = (w.wid, config, stage_fns, *w.child_ends, self._arenas, self._cancelled, others)
            process = ctx.Process(
                target=worker_main, args=args, name=f"torch_spdl-worker-{w.wid}", daemon=True
            )
            w.child = Child(process, ends=(w.tasks, w.results))  # forked by start()
        #: The worker processes, by worker id (what torch's iterator shows as ``_workers``).
        self.processes: list[Child] = [w.child for w in self._workers]
        self._started = False
        self._pumping = threading.Lock()  # one reader of the pipes at a time
        self._outbox = Outbox("torch_spdl-worker-sender")
        self._receiver: threading.Thread | None = None
        if receiver:
            self._receiver = threading.Thread(
                target=self._receive, name="torch_spdl-worker-receiver", daemon=True
            )

    def start(self) -> None:
        """Fork the workers (the first call; later ones do nothing).

        Separate from making the pool so that its owner forks from as few frames as it
        can: a forked worker keeps the frames of the thread that forked it under its own,
        and code that walks the stack for every sample pays for each of them. torchvision's
        ``FakeData`` (``--dummy`` in pytorch/examples' imagenet) calls ``torch.manual_seed``
        for every sample, which formats the whole stack three times (``traceback``, in
        ``torch.cuda._lazy_call`` and its XPU and MTIA twins); a frame more cost 7-8 us a
        sample on 2 cores, and forking six frames below where torch's loader forks cost a
        worker 8% more CPU than torch's on 64x64 ``FakeData``. The owner (the epoch's
        ``next()`` side, or the pipeline's parts) holds the pool before the fork, so a fork
        that fails leaves nothing without an owner.
        """
        if self._started:
            return
        self._started = True
        for w in self._workers:
            w.child.process.start()
            self._watch.add(w, w.results, w.child)
        # The parent keeps its own ends only, once every worker started: a later worker
        # gets the earlier ones' ends to close (pickled, with a start method other than fork).
        for w in self._workers:
            for end in w.child_ends:
                end.close()
        if self._receiver is not None:
            self._receiver.start()

    # -- the loader's side ----------------------------------------------------------------
    def submit(
        self, b: int, values: Any, split: int | None, indices: list[Any], wid: int | None = None
    ) -> Future[Fetched | None]:
        """Send batch ``b`` to worker ``b % num_workers`` (or ``wid``) once an arena is free.

        Call it from one thread, in batch order: each worker runs its batches in the order
        they were sent, which keeps its random draws equal to those under torch.
        ``values`` are the batch's indices (``split`` None: ``__getitem__``) or the values
        the first ``split`` stages made on threads; ``indices`` name failed samples."""
        worker = self._workers[b % self.num_workers if wid is None else wid]
        if worker.dead is not None:
            raise worker.dead
        try:
            # Plain pickle, not multiprocessing's: a tensor travels by value, whatever its
            # storage (torch's reductions would try to share it: a file-backed storage,
            # as torchvision's read_file makes, fails there).
            payload = dumps((values, indices))
        except Exception as exc:
            exc.add_note(
                f"torch_spdl.DataLoader: batch {b} (sample indices {indices!r}) could not "
                f"be sent to worker process {worker.wid}: what the stages before it made "
                "must pickle"
            )
            unsent: Future[Fetched | None] = Future()
            unsent.set_result(Fetched(samples=[], errors=[(-1, indices, exc)]))
            return unsent
        return self._send(b, worker, lambda task_id, slot: LoadBatch(task_id, slot, payload, split))

    def next_batch(self, key: int, wid: int, epoch: int, state: Any) -> Future[Fetched | None]:
        """Ask worker ``wid`` for its iterable dataset's next batch of ``epoch`` (restoring
        ``state`` first, if not None); ``key`` names it for the arenas, as a batch number
        does. The future's result is None once the worker's iterator has ended."""
        worker = self._workers[wid]
        if worker.dead is not None:
            raise worker.dead
        payload = dumps((epoch, state))
        return self._send(key, worker, lambda task_id, slot: NextBatch(task_id, slot, payload))

    def _send(
        self, b: int, worker: WorkerRecord, task: Callable[[int, int], LoadBatch | NextBatch]
    ) -> Future[Fetched | None]:
        """Send ``task(task_id, arena)`` to ``worker`` once an arena is free for batch ``b``."""
        slot: int | None = NO_ARENA
        if self._arenas is not None:
            slot = self._leases.take(b, block=self._receiver is not None)
        if slot is None:
            raise _closed()
        future: Future[Fetched | None] = Future()
        with self._lock:
            if self._closed:
                raise _closed()
            task_id = next(self._ids)
            self._pending[task_id] = (future, worker, slot)
        if worker.dead is not None:  # it died while this batch waited for an arena
            self._fail_worker(worker, worker.dead)
            return future
        self._outbox.send(worker.tasks, task(task_id, slot))
        return future

    def result(self, future: Future[Fetched | None], timeout: float | None = None) -> Any:
        """What ``future`` (from :meth:`submit`) holds, waiting at most ``timeout`` seconds
        (``TimeoutError`` then). Without a receiver thread the waiting thread reads the
        workers' pipes itself."""
        if self._receiver is not None:
            return future.result(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._pumping:
            while not future.done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no batch from the worker processes within {timeout} s")
                if not self._pump(left):
                    break
        return future.result(0)

    def delivered(self, b: int) -> None:
        """The training loop was given batch ``b`` (its arena now counts as the loop's)."""
        self._leases.delivered(b)

    def no_more_tasks(self) -> None:
        """Nothing more will be submitted (an epoch's own pool sent its last batch): each
        worker exits once it has made its batches (see the module's doc)."""
        with self._lock:
            if not self._closed:
                for w in self._workers:
                    self._outbox.stop(w.tasks)

    def cancel_pending(self, *, for_good: bool = False) -> None:
        """Fail every batch still waited for (the epoch ended early). The workers make
        those batches all the same, as torch's persistent workers do: what they draw for
        them is part of torch's random stream for the next epoch. Each arena is free again
        when its (discarded) reply arrives.

        With ``for_good`` (the workers are about to stop), each worker finishes the batch
        it is making and skips the other tasks it was handed (``CancelledTasks``), as
        torch's workers do once their iterator shuts down, so that stopping never waits
        for batches nobody will read."""
        with self._lock:
            pending, self._pending = self._pending, {}
            for task_id, (_, _, slot) in pending.items():
                self._discarded[task_id] = slot
            if for_good and self._cancelled is not None:
                self._cancelled.cancel_below(next(self._ids))
        self._leases.interrupt()
        for future, _, _ in pending.values():
            future.set_exception(_closed())

    def shutdown(self) -> None:
        """Stop the workers (killing any that do not stop at once) and the receiver."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._leases.close()
        self.cancel_pending(for_good=True)
        for w in self._workers:
            self._outbox.stop(w.tasks)
        self._outbox.finish()
        self._wake_w.send(None)
        if self._receiver is not None and self._receiver.is_alive():
            self._receiver.join()
        for w in self._workers:  # a worker busy in user code, or stuck, is killed
            w.child.stop(_GRACE_S, kill_at_once=True, release=True)
        # A write to a worker that was stuck with a full pipe failed when it was killed.
        self._outbox.join()
        for w in self._workers:
            w.child.close_pipes()
            for end in w.child_ends:  # never started: the child's ends are still here
                end.close()
        if self._cancelled is not None:
            self._cancelled.close()
        for arena in self._arenas or ():
            arena.close()  # a batch still in use keeps its mapping until it is freed
        self._wake_r.close()
        self._wake_w.close()

    # -- reading results (on the receiver thread, or in the thread that waits) -------------
    def _receive(self) -> None:
        while self._pump(None):
            pass

    def _pump(self, timeout: float | None) -> bool:
        """Read what the workers sent, or learn that one died, waiting at most ``timeout``;
        False once the workers are being shut down."""
        watch = self._watch
        ready = watch.wait(timeout)
        if ready is None:
            return False
        for worker in ready.readable:
            try:
                self._settle(worker, receive(worker.results))
            except (EOFError, OSError):
                watch.forget(worker.results)  # exiting: its exit tells why
        for worker in ready.exited:
            while watch.watching(worker.results) and worker.results.poll():
                try:  # what it sent before it exited
                    self._settle(worker, receive(worker.results))
                except (EOFError, OSError):
                    break
            watch.forget(worker.results)
            if not self._closed and worker.dead is None:
                worker.child.join(_GRACE_S)
                # Told to stop (no_more_tasks), it exits cleanly once its batches are made
                # (its results were read above); otherwise it died.
                with self._lock:
                    waited = any(w is worker for _, w, _ in self._pending.values())
                told = self._outbox.stopped(worker.tasks)
                if waited or not told or worker.child.exitcode != 0:
                    worker.dead = died(worker)
                    self._fail_worker(worker, worker.dead)
        return True

    def _settle(self, worker: WorkerRecord, reply: Reply) -> None:
        if isinstance(reply, InitFailed):
            error = reply.error.rebuild("worker process")
            error.add_note(f"torch_spdl.DataLoader: worker_init_fn failed in worker {worker.wid}")
            worker.dead = error
            self._fail_worker(worker, error)
            return
        with self._lock:
            entry = self._pending.pop(reply.task_id, None)
            discarded = self._discarded.pop(reply.task_id, None)
        if entry is None:  # a batch of an epoch that ended: its arena is free again
            if discarded is not None:
                self._leases.release(discarded)
            return
        future, _, slot = entry
        try:
            outcome = self._outcome(worker, reply, slot)
        except BaseException as exc:  # a batch that cannot be read back
            self._leases.release(slot)
            exc.add_note(f"torch_spdl.DataLoader: reading a batch from worker {worker.wid}")
            future.set_exception(exc)
        else:
            future.set_result(outcome)

    def _outcome(self, worker: WorkerRecord, reply: Reply, slot: int) -> Fetched | None:
        if isinstance(reply, Exhausted):  # an iterable dataset's worker has no more batches
            self._leases.release(slot)
            return None
        if isinstance(reply, Skipped):  # never for a batch still waited for
            raise RuntimeError(f"worker {worker.wid} skipped a batch the loader waits for")
        assert not isinstance(reply, InitFailed)
        arena = self._arenas[slot] if self._arenas is not None and slot != NO_ARENA else None
        release: Callable[[], None] = _nothing
        if arena is not None:  # the leases only: a batch the loop keeps keeps no workers
            release = functools.partial(self._leases.release, slot)
            if reply.used:
                self._leases.written(slot)
        value = load_batch(reply.data, arena, reply.size, reply.used, release)
        if not isinstance(reply, BatchWithErrors):
            if reply.inline is not None:
                self._learned[worker.wid] = reply.inline
            return Fetched(batch=value, state=reply.state)
        errors = []
        for failed in reply.errors:
            error = failed.error.rebuild("worker process")
            error.add_note(
                f"torch_spdl.DataLoader: (in worker process {worker.wid}, pid {worker.child.pid})"
            )
            errors.append((failed.pos, failed.index, error))
        return Fetched(samples=value, errors=errors)

    def _fail_worker(self, worker: WorkerRecord, error: BaseException) -> None:
        with self._lock:
            mine = [k for k, (_, w, _) in self._pending.items() if w is worker]
            entries = [self._pending.pop(k) for k in mine]
        for future, _, slot in entries:  # a dead worker writes no arena any more
            self._leases.release(slot)
            future.set_exception(error)


def _cool(arenas: list[Arena], slot: int) -> None:
    arenas[slot].cool()


def _nothing() -> None:
    pass


def _closed() -> RuntimeError:
    return RuntimeError("the DataLoader's worker processes were stopped")
