"""Transformations of sources (``spdl.source.utils``): repeat one, or merge several.

They are plain iterables, so they work as the source of a pipeline, of a DataLoader, or
anywhere else; they start no thread.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import TypeGuard, TypeVar

from ..pipeline import iterate_in_subprocess
from ._types import IterableWithShuffle

__all__ = ["MergeIterator", "embed_shuffle", "iterate_in_subprocess", "repeat_source"]

T = TypeVar("T")


def repeat_source(src: Iterable[T], epoch: int = 0) -> Iterator[T]:
    """Iterate ``src`` forever, one epoch after another.

    Before each epoch, a source with a ``shuffle`` method (an ``IterableWithShuffle``) is
    reshuffled with ``shuffle(seed=epoch)``, so every epoch has its own, reproducible
    order.

    Args:
        src: the source to repeat (it must be re-iterable).
        epoch: the number of the first epoch (resume from a checkpoint with it).
    """
    shuffle = getattr(src, "shuffle", None)
    while True:
        if shuffle is not None:
            shuffle(seed=epoch)
        yield from src
        epoch += 1


def _has_shuffle(src: Iterable[T]) -> TypeGuard[IterableWithShuffle[T]]:
    return callable(getattr(src, "shuffle", None))


class _EmbeddedShuffle(Iterable[T]):
    def __init__(self, src: IterableWithShuffle[T], epoch: int) -> None:
        self.src = src
        self.epoch = epoch

    def __iter__(self) -> Iterator[T]:
        self.src.shuffle(seed=self.epoch)
        self.epoch += 1
        return iter(self.src)

    def __len__(self) -> int:
        if not isinstance(self.src, Sized):
            raise TypeError(f"object of type {type(self.src).__name__} has no len()")
        return len(self.src)


def embed_shuffle(src: Iterable[T], /, *, epoch: int = 0) -> Iterable[T]:
    """Make a source reshuffle itself: each iteration first calls
    ``src.shuffle(seed=epoch)``, with ``epoch`` counting up from the given value.

    Args:
        src: an ``IterableWithShuffle`` (it has ``shuffle(seed=...)``).
        epoch: the seed of the first iteration.
    """
    if not _has_shuffle(src):
        raise TypeError(
            f"embed_shuffle needs a source with a shuffle(seed=...) method, got {src!r}"
        )
    return _EmbeddedShuffle(src, epoch)


class MergeIterator(Iterable[T]):
    """Interleave several iterables into one.

    Without ``weights`` the iterables take turns, one item each. With ``weights`` the next
    iterable is drawn at random in those proportions (from ``seed``, so the order is
    reproducible).

    Args:
        iterables: the sources (at least one).
        weights: one positive weight per iterable, or None for turns.
        stop_after: ``0`` goes on until every iterable is exhausted (an exhausted one is
            skipped); ``n > 0`` stops after ``n`` items (or earlier, when all are
            exhausted); ``-1`` stops as soon as one iterable is exhausted.
        seed: seeds the draws when ``weights`` is given.
    """

    def __init__(
        self,
        iterables: Sequence[Iterable[T]],
        *,
        weights: Sequence[float] | None = None,
        stop_after: int = 0,
        seed: int = 0,
    ) -> None:
        if not iterables:
            raise ValueError("MergeIterator needs at least one iterable")
        if weights is not None:
            if len(weights) != len(iterables):
                raise ValueError(
                    f"MergeIterator got {len(weights)} weights for {len(iterables)} iterables"
                )
            if any(not w > 0 for w in weights):
                raise ValueError(f"MergeIterator weights must be positive, got {list(weights)}")
        if not isinstance(stop_after, int) or stop_after < -1:
            raise ValueError(f"stop_after must be an int >= -1, got {stop_after!r}")
        self.iterables = iterables
        self.weights = weights
        self.stop_after = stop_after
        self.seed = seed

    def __iter__(self) -> Iterator[T]:
        iterators: list[Iterator[T] | None] = [iter(it) for it in self.iterables]
        picks = self._turns(len(iterators)) if self.weights is None else self._draws()
        live, count, limit = len(iterators), 0, self.stop_after
        for i in picks:
            it = iterators[i]
            if it is None:
                continue
            try:
                item = next(it)
            except StopIteration:
                if limit == -1:
                    return
                iterators[i] = None
                live -= 1
                if not live:
                    return
                continue
            yield item
            count += 1
            if 0 < limit <= count:
                return

    @staticmethod
    def _turns(n: int) -> Iterator[int]:
        while True:
            yield from range(n)

    def _draws(self) -> Iterator[int]:
        assert self.weights is not None
        rng, population = random.Random(self.seed), list(range(len(self.weights)))
        while True:
            yield from rng.choices(population, self.weights, k=64)
