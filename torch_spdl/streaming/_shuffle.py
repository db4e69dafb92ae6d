"""A bounded shuffle buffer whose state can be saved and restored.

Shards are shuffled by epoch (:mod:`._plan`), but samples inside a shard stay together;
the buffer mixes them: it holds up to ``size`` samples and, once full, hands out one
drawn at random for each one it takes in (the scheme WebDataset and tf.data use). Its
memory is ``size`` samples, as the decode stage made them.

For an exact resume its state is the identities of the samples it holds, in slot order,
and its RNG's state; the RNG is a ``random.Random`` of its own, seeded from the data set's
seed, the epoch and the consumer, never the global one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["ShuffleBuffer"]

T = TypeVar("T")


class ShuffleBuffer(Generic[T]):
    """Up to ``size`` items; ``push`` returns one drawn at random once it is full.

    Args:
        size: how many items it holds (0 or 1: no shuffling, items pass straight on).
        seed: seeds its own RNG.
    """

    def __init__(self, size: int, seed: str | int) -> None:
        if size < 0:
            raise ValueError(f"the shuffle buffer size must be non-negative, got {size}")
        self.size = size
        self.rng = random.Random(seed)
        self.items: list[T] = []

    def push(self, item: T) -> T | None:
        """Take ``item``; return the item drawn to go out, or None while filling."""
        if self.size <= 1:
            return item
        self.items.append(item)
        if len(self.items) < self.size:
            return None
        return self._draw()

    def drain(self) -> Iterator[T]:
        """The items left, in random order (at the end of the stream)."""
        while self.items:
            yield self._draw()

    def _draw(self) -> T:
        items = self.items
        i = self.rng.randrange(len(items))
        items[i], items[-1] = items[-1], items[i]
        return items.pop()

    def get_rng_state(self) -> Any:
        return self.rng.getstate()

    def set_rng_state(self, state: Any) -> None:
        self.rng.setstate(_as_state(state))


def _as_state(state: Any) -> Any:
    """``random.Random`` state back from a checkpoint that turned tuples into lists."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
