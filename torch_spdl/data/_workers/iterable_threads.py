"""An ``IterableDataset`` read by ``num_workers`` threads, each with its own copy, in
torch's order.

torch gives each worker process its own copy of an iterable dataset, with its worker
information set, so that a dataset can shard itself (``files[info.id::info.num_workers]``);
each worker batches its own samples (``drop_last`` applies per worker), and the loader
takes the batches round-robin across workers, skipping a worker once its iterator ends.
Here the workers are threads (each with a shallow copy of the dataset, its worker id,
seed and ``worker_init_fn``, see :class:`~torch_spdl.data._loading.worker_info.WorkerGroup`), each
filling a small queue; :meth:`IterableThreads.batches` yields in the same round-robin order
(``in_order=True``) or as batches come (``in_order=False``).

An error raised by a worker's iterator is delivered in its place in the order, as torch
does, and the worker goes on calling ``next()`` on its iterator (a generator that raised
is then finished). The group is a part of the epoch's pipeline
(``PipelineBuilder.add_stoppable``): its shutdown stops every worker at its next batch; a
worker stuck inside the dataset's own ``__next__`` cannot be interrupted in Python: it is
left behind (a daemon thread), logged, and ends when that call returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..._procwire import RoundRobin
from .._loading.sample_ops import BatchError
from .._loading.worker_info import WorkerGroup

__all__ = ["IterableThreads"]

_LG = logging.getLogger("torch_spdl.data")
_DONE: Any = object()  # a worker's iterator ended
_CLOSED: Any = object()  # the pipeline stopped: the reader stops
_JOIN_S = 1.0  # how long shutdown() waits for a worker before leaving it behind


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class IterableThreads:
    """``group.num_workers`` threads reading copies of ``dataset``.

    Args:
        dataset: the ``IterableDataset``.
        group: gives each thread its worker id, dataset copy and ``worker_init_fn`` call.
        batch_size: samples per batch, or None to yield samples one by one.
        drop_last: drop each worker's last, short batch.
        prefetch: batches each worker may have ready.
        in_order: round-robin across workers (torch's order) or as they come.
    """

    def __init__(
        self,
        dataset: Any,
        group: WorkerGroup,
        batch_size: int | None,
        *,
        drop_last: bool,
        prefetch: int,
        in_order: bool,
    ) -> None:
        self._dataset = dataset
        self._group = group
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._in_order = in_order
        n = group.num_workers
        shared: queue.Queue[Any] | None = None if in_order else queue.Queue(prefetch * n)
        self._queues = [shared or queue.Queue(prefetch) for _ in range(n)]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._work, args=(wid,), name=f"torch_spdl-iterable-{wid}", daemon=True
            )
            for wid in range(n)
        ]
        self._started = False

    def batches(self) -> Iterator[Any]:
        """The workers' batches (or samples), in order; errors as ``BatchError`` items."""
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()
        if self._in_order:
            yield from self._round_robin()
        else:
            yield from self._as_they_come()

    def _round_robin(self) -> Iterator[Any]:
        turns = RoundRobin(range(len(self._queues)))
        while turns:
            wid = turns.current()
            item = self._take(self._queues[wid])
            if item is _CLOSED:
                return
            if item is _DONE:
                turns.leave(wid)
            else:
                turns.passed()
                if item is not None:
                    yield item

    def _as_they_come(self) -> Iterator[Any]:
        running = len(self._threads)
        q = self._queues[0]
        while running:
            item = self._take(q)
            if item is _CLOSED:
                return
            if item is _DONE:
                running -= 1
            elif item is not None:
                yield item

    def _take(self, q: queue.Queue[Any]) -> Any:
        item = q.get()
        if isinstance(item, _Failed):
            return BatchError(item.error)
        return item

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        """Put ``item``; False when stopping (``shutdown`` empties the queues, so a put
        that was waiting returns)."""
        q.put(item)
        return not self._stop.is_set()

    def _work(self, wid: int) -> None:
        q = self._queues[wid]
        try:
            self._group.enter(wid)
            samples = iter(self._group.local_dataset())
        except Exception as exc:
            exc.add_note(f"torch_spdl.DataLoader: starting iterable worker {wid}")
            self._put(q, _Failed(exc))
            self._put(q, _DONE)
            return
        size = self._batch_size
        batch: list[Any] = []
        while not self._stop.is_set():
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as exc:
                exc.add_note(f"torch_spdl.DataLoader: iterable worker {wid} failed")
                if not self._put(q, _Failed(exc)):
                    return
                continue
            if size is None:
                if not self._put(q, sample):
                    return
                continue
            batch.append(sample)
            if len(batch) == size:
                if not self._put(q, batch):
                    return
                batch = []
        if batch and not self._drop_last and not self._put(q, batch):
            return
        self._put(q, _DONE)

    def shutdown(self) -> None:
        """Stop the workers; one stuck in the dataset's code is left behind (logged)."""
        self._stop.set()
        deadline = time.monotonic() + _JOIN_S
        for t in self._threads:
            while t.is_alive() and time.monotonic() < deadline:
                for q in self._queues:  # a worker waiting to put can then see the stop
                    while not q.empty():
                        q.get_nowait()
                t.join(0.01)
            if t.is_alive():
                _LG.warning(
                    "torch_spdl.DataLoader: iterable worker %s is still inside the dataset's "
                    "__next__; it is left to finish on its own",
                    t.name,
                )
        for q in self._queues:  # wake the reader, wherever it waits
            while True:
                try:
                    q.put_nowait(_CLOSED)
                    break
                except queue.Full:
                    q.get_nowait()
