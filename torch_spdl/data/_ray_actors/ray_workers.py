"""DataLoader workers that are Ray actors (``worker_type="ray"``): the loader's side.

:class:`RayWorkers` stands where
:class:`~torch_spdl.data._workers.process_pool.ProcessWorkers` stands (the same calls:
``submit``, ``next_batch``, ``result``, ``cancel_pending``, ``shutdown``), so every
loading shape that feeds worker processes feeds Ray actors unchanged: batch ``b`` goes to
worker ``b % num_workers``, at most ``prefetch_factor * num_workers`` batches are in
flight (the trainer sends the next one only as it takes one: a slow trainer never fills
the object store), and the batches come back in torch's order. What runs in an
actor is :mod:`.ray_actor`.

**The dataset crosses once.** The dataset, ``collate_fn`` and ``worker_init_fn`` are
pickled together (cloudpickle) and put in the object store once; every actor reads that
one object. An epoch pickles them again only to compare: the same bytes reuse the same
object (so a loader without persistent workers does not send its dataset every epoch),
and a dataset changed between epochs (``set_epoch``, say) is sent again, as torch's new
workers would see it.

**Nothing lost, nothing twice.** Each worker's batches are kept in order until received.
When an actor dies (killed, its node lost: Ray raises ``RayActorError``, or the batch's
object is lost with the node), it is replaced in its slot (``torch_spdl._ray.ActorSet``,
a bounded budget): the replacement is seeded as the dead one was, restores the RNG state
that came back with the last batch received from it, and makes again, in order, every
batch not yet received (and any received after a lost one, discarded, so that its RNG
draws advance as the dead actor's did). The epoch then delivers every batch once, and
the same batches as with no failure. An ``IterableDataset``'s worker is brought back by
reading its stream again from the epoch's start, from the RNG state its first batch of
the epoch reported it began with (a stateful one instead restores its state, and the RNGs
of its last batch). Batches nobody waits for any more (an epoch left early) still run in
the actor, as torch's persistent workers make them, but their results are dropped at once:
the object store keeps only what a caller will read.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..._ray import ActorSet, ReplacementsExhausted, connect, unpack
from .._loading.fetch import Fetched
from .ray_actor import LoaderActor, Reply, RngState

__all__ = ["RayWorkers", "WHO"]

WHO = "torch_spdl.DataLoader(worker_type='ray')"
_POLL_S = 0.2  # how often a wait for a batch looks whether the epoch was stopped
_START_S = 120.0  # how long the actors may take to be placed and started


class _Task:
    """One batch asked of worker ``wid``: what to call again on a replacement, its
    current ObjectRef, and where it stands."""

    __slots__ = (
        "owner", "wid", "method", "args", "ref", "gen", "received", "cancelled", "rng",
        "state", "began",
    )

    def __init__(self, owner: RayWorkers, wid: int, method: str, args: tuple[Any, ...]) -> None:
        self.owner = owner
        self.wid = wid
        self.method = method
        self.args = args
        self.ref: Any = None
        self.gen = 0
        self.received = False
        self.cancelled = False
        self.rng: RngState | None = None  # the actor's RNGs after it, once received
        self.state: Any = None  # a stateful iterable dataset's, after it
        self.began: RngState | None = None  # an epoch's first batch: the RNGs before it

    def result(self, timeout: float | None = None) -> Fetched | None:
        """Wait for the batch (the pipeline's receiving stage calls this)."""
        return self.owner.result(self, timeout)


class _Worker:
    """A worker as the loader knows it: its batches not yet settled in order, the RNG
    state after the last one settled, and (iterable) how many it read this epoch."""

    def __init__(self, wid: int) -> None:
        self.wid = wid
        self.queue: deque[_Task] = deque()
        self.rng: RngState | None = None
        self.dead: BaseException | None = None
        self.epoch: int | None = None
        self.read_this_epoch = 0
        self.state: Any = None  # a stateful iterable dataset's, after the last batch
        #: The RNGs as the current epoch's stream began (None: as seeded).
        self.epoch_rng: RngState | None = None


class RayWorkers:
    """``num_workers`` Ray actors loading batches as torch's worker processes do.

    Args:
        dataset: the dataset (pickled once to the object store).
        num_workers: how many actors.
        base_seed: worker ``i`` is seeded with ``base_seed + i``.
        worker_init_fn: run in each actor with its id after seeding.
        collate_fn: collates each batch in the actor.
        auto_collation: torch's automatic batching.
        iterable: an ``IterableDataset``'s ``(batch_size, drop_last)``, or None.
        ray_options: Ray's actor options for every actor (``num_cpus``, ``resources``,
            ``scheduling_strategy``, ...); ``address`` (popped) is the cluster to connect
            to when the process is not connected; ``max_replacements`` (popped) the
            actors that may be replaced in all (default: ``2 * num_workers``).
        io_threads: a staged dataset's ``io`` samples at once, in each actor.
        io_threads_first: each actor starts its loads on the threads (the user set
            ``io_concurrency``), else inline until they wait.
        shared: where the pickled dataset is kept across epochs (``digest -> ref``).
        timeout: seconds to wait for one batch (None: no limit).
    """

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        base_seed: int,
        worker_init_fn: Callable[[int], None] | None,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
        iterable: tuple[int | None, bool] | None,
        ray_options: dict[str, Any],
        io_threads: int,
        shared: dict[str, Any],
        io_threads_first: bool = False,
    ) -> None:
        options = dict(ray_options)
        address = options.pop("address", None)
        budget = options.pop("max_replacements", 2 * num_workers)
        self._start_s = float(options.pop("start_timeout_s", _START_S))
        check = bool(options.pop("check_resources", True))
        ray = connect(WHO, address)
        self._ray = ray
        from ray import cloudpickle

        try:
            blob = cloudpickle.dumps((dataset, collate_fn, worker_init_fn))
        except Exception as exc:
            raise TypeError(
                f"{WHO}: the dataset, collate_fn and worker_init_fn are sent to the Ray "
                f"actors and must pickle (cloudpickle), but they do not: {exc}"
            ) from exc
        digest = hashlib.blake2b(blob, digest_size=16).hexdigest()
        ref = shared.get(digest)
        if ref is None:
            shared.clear()  # the dataset changed: the old object goes
            ref = shared[digest] = ray.put(blob)
        self._errors = _ray_errors(ray)
        self.num_workers = num_workers
        self.iterable = iterable is not None
        #: torch's iterator names its worker processes; these live elsewhere.
        self.processes: list[Any] = []
        self._workers = [_Worker(i) for i in range(num_workers)]
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        remote = ray.remote(LoaderActor)
        self._actors = ActorSet(
            ray,
            remote,
            num_workers,
            lambda wid: (
                wid, num_workers, base_seed, ref, auto_collation, iterable, io_threads,
                io_threads_first,
            ),
            options,
            WHO,
            budget,
            prefix="torch_spdl-loader-",
            check=check,
        )

    # -- starting --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the actors (the first call; later ones do nothing) and wait until each is
        placed and seeded; a worker whose ``worker_init_fn`` failed fails its batches."""
        if self._started:
            return
        try:
            # placed first (a cluster without room is named as such), then started: the
            # dataset unpickled and worker_init_fn run, which may take their own time
            self._actors.wait_ready(lambda a: a.ready.remote(), self._start_s)
            starts = [actor.start.remote(None) for actor in self._actors_list()]
            errors = self._ray.get(starts)
        except BaseException as exc:  # no half-started pool is kept for a later epoch
            self.shutdown()
            for w in self._workers:
                w.dead = exc
            raise
        self._started = True
        for w, error in zip(self._workers, errors, strict=True):
            if error is not None:
                w.dead = _init_failed(error, w.wid)

    def _actors_list(self) -> list[Any]:
        return [self._actors[i] for i in range(self.num_workers)]

    # -- sending ---------------------------------------------------------------------------
    def submit(
        self, b: int, values: Any, split: int | None, indices: list[Any], wid: int | None = None
    ) -> _Task:
        """Send batch ``b`` to worker ``b % num_workers`` (or ``wid``); call it from one
        thread, in batch order (``split`` is always None: the actor runs every stage)."""
        assert split is None, "a Ray actor runs a staged dataset's every stage"
        return self._send(b % self.num_workers if wid is None else wid, "load", (values,))

    def next_batch(self, key: int, wid: int, epoch: int, state: Any) -> _Task:
        """Ask worker ``wid`` for its iterable dataset's next batch of ``epoch``."""
        return self._send(wid, "next_batch", (epoch, state))

    def _send(self, wid: int, method: str, args: tuple[Any, ...]) -> _Task:
        w = self._workers[wid]
        if w.dead is not None:
            raise w.dead
        task = _Task(self, wid, method, args)
        with self._lock:
            if self._closed:
                raise _stopped()
            if method == "next_batch" and args[0] != w.epoch:
                w.epoch, w.read_this_epoch = args[0], 0
                w.state, w.epoch_rng = None, None  # this epoch's, once its first batch settles
            task.gen = self._actors.generation[wid]
            task.ref = getattr(self._actors[wid], method).remote(*args)
            w.queue.append(task)
        return task

    # -- receiving -------------------------------------------------------------------------
    def result(self, task: _Task, timeout: float | None = None) -> Fetched | None:
        """The batch ``task`` asked for (None: an iterable worker has no more), waiting
        at most ``timeout`` seconds (``TimeoutError`` then); a dead actor is replaced and
        its batches made again meanwhile."""
        ray = self._ray
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._closed or task.cancelled or task.ref is None:
                    raise _stopped()
                ref, gen = task.ref, task.gen
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"no batch from the Ray actors within {timeout} s")
            try:
                reply: Reply = ray.get(ref, timeout=left)
            except self._errors.timeout:
                continue
            except self._errors.lost as exc:
                self._recover(task.wid, gen, exc)
                continue
            except self._errors.task as exc:  # our actor's code failed: not the user's
                raise RuntimeError(
                    f"{WHO}: worker {task.wid}'s actor failed: {exc}"
                ) from None
            return self._received(task, reply)

    def _received(self, task: _Task, reply: Reply) -> Fetched | None:
        w = self._workers[task.wid]
        with self._lock:
            task.received, task.ref, task.rng = True, None, reply.rng
            state = None if reply.state is None else pickle.loads(reply.state)
            task.state, task.began = state, reply.epoch_rng
            self._settle(w, task, reply)
        if reply.exhausted:
            return None
        where = f"Ray actor of worker {task.wid}"
        if reply.failures is None:
            return Fetched(batch=unpack(reply.data, reply.arrays), state=task.state)
        errors = []
        for failure in reply.failures:
            error = failure.error.rebuild(where)
            error.add_note(f"torch_spdl.DataLoader: (in the {where})")
            errors.append((failure.pos, failure.index, error))
        return Fetched(samples=unpack(reply.data, reply.arrays), errors=errors)

    def _settle(self, w: _Worker, task: _Task, reply: Reply) -> None:
        """Drop from the front of ``w``'s queue what is done with in order: received
        batches, and cancelled ones that a received batch after them shows were made;
        the RNG state is then the last received one's."""
        queue = w.queue
        upto = -1
        for i, t in enumerate(queue):
            if t.received:
                upto = i
            elif not t.cancelled:
                break
        for _ in range(upto + 1):
            done = queue.popleft()
            this_epoch = done.method == "next_batch" and done.args[0] == w.epoch
            if this_epoch:
                w.read_this_epoch += 1
            if done.received:
                w.rng, done.rng = done.rng, None
                if this_epoch and done.began is not None:
                    w.epoch_rng = done.began
                if this_epoch and done.state is not None:
                    w.state = done.state

    def _recover(self, wid: int, gen: int, cause: BaseException) -> None:
        """Worker ``wid``'s actor died with ``cause``: replace it (once per death) and ask
        the replacement for every batch the dead one had not settled, in order."""
        with self._lock:
            if self._closed:
                raise _stopped() from cause
            try:
                replaced = self._actors.replace(wid, gen, cause)
            except ReplacementsExhausted as exc:
                self._workers[wid].dead = exc
                raise
            if not replaced:
                return
            w = self._workers[wid]
            actor = self._actors[wid]
            new_gen = self._actors.generation[wid]
            if self.iterable and w.state is None and w.read_this_epoch:
                # read its stream again from the epoch's start, from the RNGs it began with
                actor.start.remote(w.epoch_rng)
                for _ in range(w.read_this_epoch):
                    actor.next_batch.remote(w.epoch, None)
            else:  # from the last batch settled: its RNGs (and a stateful dataset's state)
                actor.start.remote(w.rng)
            first = True
            for task in w.queue:
                args = task.args
                if first and self.iterable and w.state is not None:
                    args = (args[0], w.state)
                first = False
                ref = getattr(actor, task.method).remote(*args)
                if not (task.received or task.cancelled):  # made again for a waiting caller
                    task.ref, task.gen = ref, new_gen

    # -- the epoch's end -------------------------------------------------------------------
    def delivered(self, b: int) -> None:
        """The training loop has batch ``b`` (nothing to release: it views the store)."""

    def no_more_tasks(self) -> None:
        """The epoch sent its last batch (the actors stop with the epoch)."""

    def cancel_pending(self, *, for_good: bool = False) -> None:
        """Every batch still waited for is given up (the epoch ended early). Persistent
        actors make them all the same, as torch's persistent workers do."""
        with self._lock:
            for w in self._workers:
                for task in w.queue:
                    if not task.received:
                        # it still runs (its draws are the worker's); its result is dropped
                        task.cancelled, task.ref = True, None

    def shutdown(self) -> None:
        """Kill the actors now (a batch under way is not waited for)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                for task in w.queue:
                    task.cancelled = True
                    task.ref = None
                w.queue.clear()
                w.rng = w.epoch_rng = w.state = None
        self._actors.shutdown()


class _RayErrors:
    def __init__(
        self,
        timeout: type[BaseException],
        lost: tuple[type[BaseException], ...],
        task: type[BaseException],
    ) -> None:
        self.timeout = timeout
        self.lost = lost
        self.task = task


def _ray_errors(ray: Any) -> _RayErrors:
    ex = ray.exceptions
    lost = (ex.RayActorError, ex.ObjectLostError, ex.ActorUnavailableError)
    return _RayErrors(ex.GetTimeoutError, lost, ex.RayTaskError)


def _init_failed(error: Any, wid: int) -> BaseException:
    exc = error.rebuild(f"Ray actor of worker {wid}")
    exc.add_note(f"torch_spdl.DataLoader: worker_init_fn failed in worker {wid} (a Ray actor)")
    return exc


def _stopped() -> RuntimeError:
    return RuntimeError("the DataLoader's Ray actors were stopped")
