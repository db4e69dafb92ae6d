"""A bounded shuffle buffer whose state is small and can be restored exactly.

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

Two choices keep the state an exact resume needs small:

- the items are kept sorted by a key (the sample's place in the stream), and a draw picks
  the i-th of them: which samples the buffer holds is then all there is to know, not the
  slots they sit in (a set, which :mod:`._spans` stores in runs);
- draw number ``n`` is a hash of the seed and ``n`` (BLAKE2b), so the RNG's state is one
  count, where a ``random.Random`` has 625 words. The global RNGs are never used.

What is drawn has the distribution of the usual scheme (each held item equally likely).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["ShuffleBuffer"]

T = TypeVar("T")


class ShuffleBuffer(Generic[T]):
    """Up to ``size`` items, sorted by ``key``; ``push`` returns one drawn at random once
    it holds ``initial`` (every other push until it is full, then every push).

    Args:
        size: how many items it holds (0 or 1: no shuffling, items pass straight on).
        seed: seeds its draws.
        key: what the items are kept sorted by (unique per item).
        initial: how many it holds before the first goes out (at most ``size``).
    """

    def __init__(
        self, size: int, seed: str, key: Callable[[T], Any], initial: int | None = None
    ) -> None:
        if size < 0:
            raise ValueError(f"the shuffle buffer size must be non-negative, got {size}")
        self.size = size
        self.initial = size if initial is None else max(1, min(initial, size))
        self.key = key
        self._seed = hashlib.blake2b(seed.encode(), digest_size=16).digest()
        self.items: list[T] = []
        self.pushed = 0
        self.draws = 0

    def insert(self, item: T) -> None:
        """Hold ``item`` without drawing (a restored buffer's)."""
        bisect.insort(self.items, item, key=self.key)

    def push(self, item: T) -> T | None:
        """Take ``item``; return the item drawn to go out, or None while filling."""
        if self.size <= 1:
            return item
        self.insert(item)
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
        digest = hashlib.blake2b(
            self._seed + self.draws.to_bytes(8, "little"), digest_size=8
        ).digest()
        self.draws += 1
        return self.items.pop(int.from_bytes(digest, "little") % len(self.items))
