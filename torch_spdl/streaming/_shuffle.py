"""A bounded shuffle buffer whose state can be saved and restored.

Shards are shuffled by epoch (:mod:`._plan`), but samples inside a shard stay together;
the buffer mixes them: it holds up to ``size`` samples and, once full, hands out one
drawn at random for each one it takes in (the scheme WebDataset and tf.data use). Its
memory is ``size`` samples, as the stream made them.

A buffer that waited to be full before its first sample would make the first batch wait
for ``size`` samples to be read (8 shards of 128 for the default 1,000). It starts
handing out once it holds ``initial`` samples instead, and until it is full takes two in
for each one it lets out, so it still grows to ``size``: the first samples of an epoch
are drawn from fewer, the price of a first batch after ``initial`` samples rather than
``size`` (webdataset's ``shuffle(n, initial=100)`` makes the same trade).

For an exact resume its state is the identities of the samples it holds, in slot order,
how many it has taken in, and its RNG's state; the RNG is a ``random.Random`` of its own,
seeded from the data set's seed, the epoch and the consumer, never the global one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["ShuffleBuffer"]

T = TypeVar("T")


class ShuffleBuffer(Generic[T]):
    """Up to ``size`` items; ``push`` returns one drawn at random once it holds
    ``initial`` (every other push until it is full, then every push).

    Args:
        size: how many items it holds (0 or 1: no shuffling, items pass straight on).
        seed: seeds its own RNG.
        initial: how many it holds before the first goes out (at most ``size``).
    """

    def __init__(self, size: int, seed: str | int, initial: int | None = None) -> None:
        if size < 0:
            raise ValueError(f"the shuffle buffer size must be non-negative, got {size}")
        self.size = size
        self.initial = size if initial is None else max(1, min(initial, size))
        self.rng = random.Random(seed)
        self.items: list[T] = []
        self.pushed = 0

    def push(self, item: T) -> T | None:
        """Take ``item``; return the item drawn to go out, or None while filling."""
        if self.size <= 1:
            return item
        self.items.append(item)
        self.pushed += 1
        held = len(self.items)
        if held >= self.size or (held >= self.initial and self.pushed % 2 == 0):
            return self._draw()
        return None

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
