"""Loading one batch in one go: what a worker (a process, or a thread given whole batches)
does with the indices of a batch, as torch's fetcher does.

A dataset with ``__getitems__`` gets the whole batch of indices at once, as under torch.
Otherwise each sample is loaded on its own, and a sample that fails does not stop the
others: the caller decides, with the loader's failure budget, whether the batch can go on
without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .staged_batch import StageFailed
from .worker_info import hidden_worker_info

__all__ = ["Fetched", "IterableFetcher", "fetch_batch", "is_stateful"]

_WHO = "torch_spdl.DataLoader"
_ENDED: Any = object()


class Fetched:
    """A loaded batch: ``batch`` when every sample loaded and collated; otherwise the
    ``samples`` that loaded, as ``(position, sample)``, and the ``errors`` as
    ``(position, index, exception)``. Position ``-1`` is an error of the whole batch
    (``collate_fn`` or ``__getitems__`` failed). ``state``: a stateful iterable dataset's
    ``state_dict()`` right after the batch was drawn (see :func:`is_stateful`)."""

    __slots__ = ("batch", "samples", "errors", "state")

    def __init__(
        self,
        batch: Any = None,
        samples: list[tuple[int, Any]] | None = None,
        errors: list[tuple[int, Any, BaseException]] | None = None,
        state: Any = None,
    ) -> None:
        self.batch = batch
        self.samples = samples
        self.errors = errors
        self.state = state


def is_stateful(dataset: Any) -> bool:
    """Whether an iterable dataset saves and restores its own position (torch's
    ``Stateful`` protocol, as ``torchdata``'s stateful loader reads it): its
    ``state_dict()`` then travels with each batch from the worker, and a restore hands
    each worker its own state instead of replaying the stream."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def fetch_batch(
    dataset: Any,
    values: list[Any],
    indices: list[Any],
    steps: Sequence[Callable[[Any], Any]] | None,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
) -> Fetched:
    """Run ``steps`` on each of ``values`` (``dataset[value]`` when ``steps`` is None),
    then ``collate_fn`` on the batch (on the one sample without auto-collation)."""
    getitems = getattr(dataset, "__getitems__", None) if steps is None else None
    samples: list[Any] = []
    errors: list[tuple[int, Any, BaseException]] = []
    if getitems and auto_collation:
        try:
            samples = list(getitems(values))
        except Exception as exc:
            exc.add_note(f"{_WHO}: '__getitems__' failed on the batch of indices {indices!r}")
            return Fetched(samples=[], errors=[(-1, indices, exc)])
    else:
        for pos, value in enumerate(values):
            if isinstance(value, StageFailed):  # its io stage failed in the worker's threads
                errors.append((pos, indices[pos], value.exc))
                continue
            name = "getitem"
            try:
                if steps is None:
                    value = dataset[value]
                else:
                    for fn in steps:
                        name = getattr(fn, "__name__", "stage")
                        value = fn(value)
            except Exception as exc:
                exc.add_note(f"{_WHO}: stage {name!r} failed on sample index {indices[pos]!r}")
                errors.append((pos, indices[pos], exc))
                continue
            samples.append(value)
    if errors:
        failed = {pos for pos, _, _ in errors}
        good = [pos for pos in range(len(values)) if pos not in failed]
        return Fetched(samples=list(zip(good, samples, strict=True)), errors=errors)
    try:
        with hidden_worker_info():
            return Fetched(batch=collate_fn(samples if auto_collation else samples[0]))
    except Exception as exc:
        exc.add_note(f"{_WHO}: stage 'collate' failed on the batch of indices {indices!r}")
        return Fetched(samples=[], errors=[(-1, indices, exc)])


class IterableFetcher:
    """The next batch of an ``IterableDataset``'s copy, in a worker process, as torch's
    worker makes it: ``batch_size`` samples collated (``None``: each sample on its own,
    through ``collate_fn``), the last short batch dropped with ``drop_last``.

    A new ``epoch`` starts a fresh iterator. An error raised by the iterator fails that
    batch (the samples drawn for it before are lost, as under torch) and the next call goes
    on with the same iterator."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        drop_last: bool,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
    ) -> None:
        self._dataset = dataset
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._collate_fn = collate_fn
        self._auto_collation = auto_collation
        self._epoch: Any = None
        self._samples: Any = None
        self._ended = False
        self._stateful = is_stateful(dataset)

    def next(
        self, epoch: Any, state: Any = None, *, collate_fn: Callable[[Any], Any] | None = None
    ) -> Fetched | None:
        """The next batch of ``epoch``; None once the iterator has ended. ``state``, with
        the first request of an epoch, is restored into a stateful dataset first.
        ``collate_fn``: this batch's, in place of the fetcher's (the same function placing
        its output elsewhere)."""
        if epoch != self._epoch:
            self._epoch, self._samples, self._ended = epoch, None, False
            if state is not None and self._stateful:
                self._dataset.load_state_dict(state)
        if self._ended:
            return None
        try:
            if self._samples is None:
                self._samples = iter(self._dataset)
            samples = self._draw()
        except Exception as exc:
            exc.add_note(f"{_WHO}: the IterableDataset's iterator failed")
            return Fetched(samples=[], errors=[(-1, None, exc)])
        if samples is _ENDED:
            return None
        state = self._dataset.state_dict() if self._stateful else None
        try:
            with hidden_worker_info():
                collate = self._collate_fn if collate_fn is None else collate_fn
                return Fetched(batch=collate(samples), state=state)
        except Exception as exc:
            exc.add_note(f"{_WHO}: stage 'collate' failed on a batch of the IterableDataset")
            return Fetched(samples=[], errors=[(-1, None, exc)])

    def _draw(self) -> Any:
        if not self._auto_collation:
            try:
                return next(self._samples)
            except StopIteration:
                self._ended = True
                return _ENDED
        assert self._batch_size is not None
        batch: list[Any] = []
        try:
            while len(batch) < self._batch_size:
                batch.append(next(self._samples))
        except StopIteration:
            self._ended = True
        if not batch or (self._drop_last and len(batch) < self._batch_size):
            self._ended = True
            return _ENDED
        return batch
