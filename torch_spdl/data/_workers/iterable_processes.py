"""An ``IterableDataset`` read by worker processes, in torch's order.

As under torch, each worker process holds its own copy of the dataset (inherited by the
fork) with its worker information set, so that the dataset can shard itself; it draws its
own batches, collates them itself and hands them back through shared memory
(:mod:`.process_pool`). Here the loader asks each worker for a batch at a time, keeping
``prefetch`` requests outstanding per worker, and takes the answers round-robin across the
workers (the process wire's ``RoundRobin``), skipping a worker once its iterator has ended
(``in_order=True``, torch's order), or as they come (``in_order=False``).

An error raised by a worker's iterator takes that batch's place in the order, as under
torch, and the worker goes on with its iterator. A worker that dies ends the epoch with an
error naming it.

In torch's order the calling thread can do all of it inside ``next()`` (:func:`caller_feed`),
as torch's loader does and as the map-style default does (``_epoch/caller.py``): no pipeline, no
receiver thread waking while the training step runs.

A *stateful* dataset (one with ``state_dict`` / ``load_state_dict``, such as
``torch_spdl.streaming.StreamingDataset``) sends its state back with each batch; the
feed reports the state of each batch it hands on (:class:`WorkerStates`), and a restore
gives each worker its own state with its first request and goes on from the worker
whose turn was next, instead of reading the stream again to skip what was delivered.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, cast

from ..._procwire import RoundRobin
from .._loading.batch_workers import BatchWorkers, Pending
from .._loading.fetch import Fetched
from .._loading.sample_ops import BatchError

__all__ = ["WorkerStates", "caller_feed", "process_batches"]

_epochs = itertools.count()


Read = Callable[[Pending], Fetched | None]


class WorkerStates:
    """A stateful dataset's state in each worker as of the last batch handed on, and the
    worker whose turn is next: what a loader's ``state_dict()`` records."""

    def __init__(self, states: dict[int, Any] | None = None, next_worker: int = 0) -> None:
        self.states: dict[int, Any] = dict(states or {})
        self.next_worker = next_worker

    def handed_on(self, wid: int, state: Any, num_workers: int) -> None:
        if state is not None:
            self.states[wid] = state
            self.next_worker = (wid + 1) % num_workers


def process_batches(
    workers: BatchWorkers,
    prefetch: int,
    in_order: bool,
    read: Read | None = None,
    states: WorkerStates | None = None,
    restore: WorkerStates | None = None,
) -> Iterator[Any]:
    """This epoch's batches from ``workers`` (errors as ``BatchError`` items); ``read``
    waits for one (default: for the receiver thread to fill it in). ``states`` records
    a stateful dataset's state of each batch handed on; ``restore`` resumes from them."""
    epoch = next(_epochs)  # a fresh iterator in each worker (persistent ones included)
    keys = itertools.count()
    pending: dict[int, deque[tuple[int, Pending]]] = {}
    first = dict(restore.states) if restore is not None else {}

    def ask(wid: int) -> None:
        key = -1 - next(keys)  # the arena's lease key (map-style batch numbers are >= 0)
        state = first.pop(wid, None)  # a restored state goes with the first request
        pending[wid].append((key, workers.next_batch(key, wid, epoch, state)))

    # What is still pending when the epoch ends, the epoch cancels (``cancel_pending``).
    for wid in range(workers.num_workers):
        pending[wid] = deque()
        for _ in range(prefetch):
            ask(wid)
    turns = RoundRobin(
        range(workers.num_workers), restore.next_worker if restore is not None else 0
    )
    while turns:
        if in_order:
            wid = turns.current()
        else:
            # futures of worker processes (Ray's tasks are read in order: see build_iterable)
            heads = {cast(Future, pending[w][0][1]): w for w in turns.active}
            done, _ = wait(heads, return_when=FIRST_COMPLETED)
            wid = heads[next(iter(done))]
        key, future = pending[wid].popleft()
        item, state = _result(future, read)
        if item is None:  # this worker's iterator has ended
            turns.leave(wid)
            continue
        turns.passed()
        if states is not None:
            states.handed_on(wid, state, workers.num_workers)
        # Counted as the training loop's from here (batches waiting in the pipeline too),
        # before asking for the next: this thread both asks and hands batches on, so with
        # every arena held by a loop that keeps its batches, the next one goes by copy
        # instead of waiting for an arena that only the next batch would free.
        workers.delivered(key)
        ask(wid)
        yield item
        if isinstance(item, BatchError) and item.fatal:
            return


def caller_feed(
    workers: BatchWorkers,
    prefetch: int,
    skip: int,
    timeout: float | None,
    states: WorkerStates | None = None,
    restore: WorkerStates | None = None,
) -> Callable[[], tuple[int, Any]]:
    """The epoch's batches in torch's order, sent and read by the thread that calls the
    feed (``workers`` made without a receiver), after the ``skip`` delivered before a
    restore (read again and dropped, unless ``restore`` gives the workers' states);
    ``TimeoutError`` when a worker takes longer than ``timeout``."""
    read = functools.partial(workers.result, timeout=timeout)
    batches: Iterator[Any] = process_batches(workers, prefetch, True, read, states, restore)
    if restore is None:
        batches = itertools.islice(batches, skip, None)
    number = skip

    def feed() -> tuple[int, Any]:
        nonlocal number
        item = next(batches)  # StopIteration: the epoch has ended
        number += 1
        return number - 1, item

    return feed


def _result(future: Pending, read: Read | None) -> tuple[Any, Any]:
    """The batch (or its error) and the dataset's state after it."""
    try:
        fetched = read(future) if read is not None else future.result()
    except TimeoutError:
        raise
    except Exception as exc:  # the worker died, or the loader stopped
        return BatchError(exc.with_traceback(None), fatal=True), None
    if fetched is None:
        return None, None
    if fetched.errors is not None:
        return BatchError(fetched.errors[0][2]), None
    return fetched.batch, fetched.state
