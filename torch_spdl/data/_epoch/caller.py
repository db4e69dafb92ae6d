"""Loading driven from the thread that calls ``next()``, as torch's loader does.

With ``num_workers=0`` torch runs ``__getitem__`` (or the ``IterableDataset``'s iterator)
and ``collate_fn`` inside ``next()``, on the training thread. Scripts rely on that without
knowing it: a dataset that draws from the global RNGs (torchvision's random transforms,
``random``, NumPy) draws them between the training step's own draws, in one fixed order,
so a seeded run repeats itself; a dataset that sets and restores the global RNG inside
``__getitem__`` (torchvision's ``FakeData``) is alone while it does. A loader thread
running ahead would interleave its draws with the training step's and make both
unrepeatable, so by default the loader does exactly what torch does here
(:func:`inline_map`, :func:`inline_iterable`).

With worker processes, torch's ``next()`` sends the next indices and reads the next
result itself; nothing of the loader runs while the training step does. The training step
needs the cores: on 2 cores, a small CNN's training loop over batches of 256 path strings
read 24k samples/s with a receiver and a settling thread waking whenever a batch arrived,
and 28k without them (torch: 35k; the rest of that gap was the sampler, see
docs/dataloader.md). :class:`WorkerFeed` does what torch's ``next()`` does, with the
loader's shared-memory arenas.

:class:`CallerLoading` turns any of these feeds into batches, with the loader's failure
budget and its notes naming the sample, and hands back ``(batch number, batch or
BatchError)`` as the pipeline paths do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .._loading.batch_workers import BatchWorkers, Pending
from .._loading.fetch import IterableFetcher, fetch_batch
from .._loading.sample_ops import BatchError, SkipBudget
from .batch_ops import SettleBatch
from .batch_transfer import BatchMover

__all__ = ["CallerLoading", "Feed", "WorkerFeed", "inline_iterable", "inline_map"]

#: The next ``(batch number, Fetched or BatchError)``; raises ``StopIteration`` at the end.
Feed = Callable[[], tuple[int, Any]]


def inline_map(
    dataset: Any,
    batches: Iterator[tuple[int, list[Any]]],
    collate_fn: Callable[[Any], Any],
    *,
    auto_collation: bool,
) -> Feed:
    """A map-style dataset's batches, each loaded when asked for."""

    def feed() -> tuple[int, Any]:
        b, indices = next(batches)
        return b, fetch_batch(dataset, indices, indices, None, collate_fn, auto_collation)

    return feed


def inline_iterable(
    dataset: Any,
    batch_size: int | None,
    collate_fn: Callable[[Any], Any],
    *,
    drop_last: bool,
    auto_collation: bool,
    skip: int,
    restored: bool = False,
) -> Feed:
    """An ``IterableDataset``'s batches, each drawn when asked for; the first ``skip``
    (delivered before a restore) are read again and dropped: a stream can only be skipped
    by reading it, unless the dataset ``restored`` its own position."""
    stream = IterableFetcher(dataset, batch_size, drop_last, collate_fn, auto_collation)
    number = skip
    for _ in range(0 if restored else skip):
        if stream.next(0) is None:
            break

    def feed() -> tuple[int, Any]:
        nonlocal number
        fetched = stream.next(0)
        if fetched is None:
            raise StopIteration
        number += 1
        return number - 1, fetched

    return feed


class _Raise:
    """Stands in the queue of batches for an error of the sampler, raised in its turn."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class WorkerFeed:
    """Batches from worker processes, sent and read by the calling thread, in order.

    Each call keeps ``in_flight`` batches sent (torch's ``prefetch_factor *
    num_workers``), batch ``b`` to worker ``b % num_workers``, and returns the oldest once
    its worker has made it. A worker that died fails its batches with the error naming it;
    an error of the sampler is raised after the batches drawn before it.

    Args:
        workers: the epoch's worker processes (without a receiver thread).
        batches: ``(batch number, indices)`` still to deliver, in order.
        in_flight: batches sent ahead.
        timeout: seconds to wait for one batch (None: no limit).
        own_workers: the workers are this epoch's alone (not persistent): once the last
            batch is sent they are told that nothing more comes, and exit as they finish.
    """

    def __init__(
        self,
        workers: BatchWorkers,
        batches: Iterator[tuple[int, list[Any]]],
        in_flight: int,
        timeout: float | None,
        *,
        own_workers: bool = False,
    ) -> None:
        self._workers = workers
        self._own_workers = own_workers
        self._batches: Iterator[tuple[int, list[Any]]] | None = batches
        self._in_flight = in_flight
        self._timeout = timeout
        self._sent: deque[tuple[int, Pending | BatchError | _Raise]] = deque()

    def __call__(self) -> tuple[int, Any]:
        self._send()
        if not self._sent:
            raise StopIteration
        b, sent = self._sent.popleft()
        if isinstance(sent, _Raise):
            self._sent.clear()
            raise sent.error
        if isinstance(sent, BatchError):
            return b, sent
        try:
            fetched = self._workers.result(sent, self._timeout)
        except TimeoutError:
            raise
        except Exception as exc:  # the worker died, or the epoch ended
            return b, BatchError(exc.with_traceback(None), fatal=True)
        self._send()  # the workers go on while the training step runs
        return b, fetched

    def _send(self) -> None:
        while self._batches is not None and len(self._sent) < self._in_flight:
            try:
                item = next(self._batches, None)
            except Exception as exc:  # the sampler broke: raised after what it drew before
                self._batches = None
                self._sent.append((-1, _Raise(exc)))
                return
            if item is None:
                self._batches = None
                if self._own_workers:
                    self._workers.no_more_tasks()
                return
            b, indices = item
            sent: Pending | BatchError
            try:
                sent = self._workers.submit(b, indices, None, indices)
            except Exception as exc:  # the worker died or failed to start
                sent = BatchError(exc.with_traceback(None), fatal=True)
            self._sent.append((b, sent))


class CallerLoading:
    """One epoch's batches, each made when asked for, on the calling thread.

    Args:
        feed: where the batches come from (:func:`inline_map`, :func:`inline_iterable`,
            :class:`WorkerFeed`).
        budget: the epoch's failure budget.
        collate_fn: collates what is left of a batch some of whose samples were skipped.
        auto_collation: torch's automatic batching.
        mover: pins or moves each batch (``pin_memory``, ``device``).
    """

    def __init__(
        self,
        feed: Feed,
        budget: SkipBudget,
        collate_fn: Callable[[Any], Any],
        *,
        auto_collation: bool,
        mover: BatchMover,
    ) -> None:
        self._feed = feed
        self._settle = SettleBatch(budget, collate_fn, auto_collation=auto_collation)
        self._mover = mover

    def next(self) -> tuple[int, Any]:
        """The next batch (or the ``BatchError`` of a batch that failed).

        Raises:
            StopIteration: the epoch has no batch left.
            TimeoutError: a worker process took longer than the loader's ``timeout``.
        """
        while True:
            for b, batch in self._settle(self._feed()):
                if not isinstance(batch, BatchError):
                    batch = self._mover(batch)
                return b, batch
            # every sample of the batch failed and was skipped: on to the next one
