"""Loading in the thread that calls ``next()``: torch's single-process loading, kept as is.

With ``num_workers=0`` torch runs ``__getitem__`` (or the ``IterableDataset``'s iterator)
and ``collate_fn`` inside ``next()``, on the training thread. Scripts rely on that without
knowing it: a dataset that draws from the global RNGs (torchvision's random transforms,
``random``, NumPy) draws them between the training step's own draws, in one fixed order,
so a seeded run repeats itself; a dataset that sets and restores the global RNG inside
``__getitem__`` (torchvision's ``FakeData``) is alone while it does. A loader thread
running ahead would interleave its draws with the training step's and make both
unrepeatable, so by default the loader does exactly what torch does here, and a
background thread is only used when asked for (``worker_type="thread"``).

:class:`CallerLoading` makes one batch per call from the epoch's batches of indices (or
the iterable's samples), with the loader's failure budget and its notes naming the sample,
and hands back ``(batch number, batch or BatchError)`` as the pipeline paths do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._batch_stages import SettleBatch
from ._batch_transfer import BatchMover
from ._batching import BatchError, FailureBudget
from ._fetch import Fetched, IterableFetcher, fetch_batch

__all__ = ["CallerLoading"]


class CallerLoading:
    """One epoch's batches, each loaded when asked for, on the calling thread.

    Args:
        dataset: the dataset.
        batches: ``(batch number, indices)`` of a map-style epoch still to deliver, or
            None for an ``IterableDataset``.
        collate_fn: makes a batch (one sample without automatic batching).
        auto_collation: torch's automatic batching.
        batch_size: samples per batch of an iterable dataset (None: each on its own).
        drop_last: drop an iterable dataset's short last batch.
        skip: batches of an iterable dataset delivered before a restore (read again and
            dropped: a stream can only be skipped by reading it).
        budget: the epoch's failure budget.
        mover: pins or moves each batch (``pin_memory``, ``device``).
    """

    def __init__(
        self,
        dataset: Any,
        batches: Iterator[tuple[int, list[Any]]] | None,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
        batch_size: int | None,
        drop_last: bool,
        skip: int,
        budget: FailureBudget,
        mover: BatchMover,
    ) -> None:
        self._dataset = dataset
        self._batches = batches
        self._collate_fn = collate_fn
        self._auto_collation = auto_collation
        self._settle = SettleBatch(budget, collate_fn, auto_collation)
        self._mover = mover
        self._stream: IterableFetcher | None = None
        self._number = skip
        if batches is None:
            self._stream = IterableFetcher(
                dataset, batch_size, drop_last, collate_fn, auto_collation
            )
            for _ in range(skip):
                if self._stream.next(0) is None:
                    break

    def next(self) -> tuple[int, Any]:
        """The next batch (or the ``BatchError`` of a batch that failed).

        Raises:
            StopIteration: the epoch has no batch left.
        """
        while True:
            for b, batch in self._settle(self._fetch()):
                if not isinstance(batch, BatchError):
                    batch = self._mover(batch)
                return b, batch
            # every sample of the batch failed and was skipped: on to the next one

    def _fetch(self) -> tuple[int, Fetched]:
        if self._stream is not None:
            fetched = self._stream.next(0)
            if fetched is None:
                raise StopIteration
            b, self._number = self._number, self._number + 1
            return b, fetched
        assert self._batches is not None, "a map-style epoch has its batches"
        b, indices = next(self._batches)
        fetched = fetch_batch(
            self._dataset, indices, indices, None, self._collate_fn, self._auto_collation
        )
        return b, fetched
