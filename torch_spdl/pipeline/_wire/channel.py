"""A bounded queue that threads and coroutines can both read and write.

Stages of one pipeline run on worker threads (sync ops) or on the pipeline's event loop
(async ops), so the queue between two stages must serve either kind on either end. The fast
path (the queue is neither empty nor full) is one uncontended lock and one deque operation;
only a caller that must wait allocates a waiter, and a put wakes exactly one waiting
reader. Coroutines woken from their own loop's thread are resumed directly, and only a
cross-thread wake pays for ``call_soon_threadsafe`` (one per loop for a batch of them).

**Bulk hand-offs.** Under the GIL a hand-off costs about what a no-op op costs, and a
thread that finds its queue empty or full costs a thread switch (microseconds, plus the
GIL's hand-over). So fast stages move items in bulk: a reader takes every ready item up
to its limit under one lock (:meth:`Channel.get_many`), and a producer *stages* its
outputs in a segment of its own (:meth:`Channel.staging`: a deque append, no lock) that
it moves into the queue under one lock (:meth:`Channel.flush`). Staged items are never out
of a reader's reach: a reader that finds the queue empty takes from the segments, and a
producer that sees a reader waiting flushes at once, so an output never waits for the rest
of its producer's chunk (an op that blocks until the consumer has seen the previous
output still completes). A reader registers as waiting, then looks at the segments; a
producer appends, then looks for waiting readers: under the GIL one of them sees the
other. Staged items are outside ``capacity``: each producer holds at most its chunk.

Wakes are passed on, one at a time: a get that makes room wakes one blocked producer, and
a producer that leaves room wakes the next; a reader that leaves items wakes the next
reader. Waking every producer for a bulk take would wake threads that find the queue
full again (two thread switches each for nothing).

A producer blocked on a full channel is woken by the get that leaves at most ``refill_at``
items: by default the first get that makes room, one producer per place. A channel
between the loop and a thread refills in bursts instead (``refill_at`` at half): its
producers are woken once it is half empty, all that fit at once. Each wake there crosses
threads: a source feeding coroutines would be handed the GIL once per key, which at tens
of thousands of items a second was a third of the process's CPU; coroutines feeding the
consumer's thread would wake the loop once per item.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, TypeVar

from .bulk import BulkEnds
from .waiting import (
    EMPTY,
    EOF,
    AsyncWaiter,
    ChannelAborted,
    ThreadWaiter,
    Waiter,
    wake_every,
    wake_together,
)

__all__ = ["EMPTY", "EOF", "Channel", "ChannelAborted"]

T = TypeVar("T")


class Channel(BulkEnds[T]):
    """Bounded multi-producer multi-consumer queue with sync and async ends.

    ``capacity <= 0`` means unbounded. ``close(error)`` marks the end of the stream: readers
    drain what is left, then receive :data:`EOF` and can read ``close_error``.
    ``abort(reason)`` discards everything (or, with ``keep_into``, hands it to the caller)
    and makes every pending and later call raise :class:`ChannelAborted`.
    ``refill_at``: a producer blocked on the full channel is woken by the get that leaves
    at most this many items (default ``capacity - 1``: as soon as there is room).
    """

    __slots__ = (
        "name",
        "capacity",
        "refill_at",
        "_items",
        "_mutex",
        "_getters",
        "_putters",
        "_woken",
        "_closed",
        "close_error",
        "_abort",
        "n_gets",
        "depth_sum",
        "_segments",
    )

    def __init__(self, capacity: int, name: str = "", *, refill_at: int | None = None) -> None:
        self.name = name
        self.capacity = capacity if capacity > 0 else 0
        # a blocked putter is woken once at most this many items remain
        last = self.capacity - 1
        self.refill_at = last if refill_at is None else max(0, min(refill_at, last))
        self._items: deque[T] = deque()
        self._mutex = threading.Lock()
        self._getters: deque[Waiter] = deque()
        self._putters: deque[Waiter] = deque()
        self._woken = 0  # putters woken for room that have not come back to put yet
        self._closed = False
        self.close_error: BaseException | None = None
        self._abort: ChannelAborted | None = None
        # Occupancy seen by readers: the sum of queue depths at each successful get.
        self.n_gets = 0
        self.depth_sum = 0
        self._segments: list[deque[T]] = []  # producers' staged items (module notes)

    def __len__(self) -> int:
        return len(self._items)

    # -- producer side -------------------------------------------------------------------
    def _try_put(self, item: T) -> bool:
        """Put without waiting; False when the channel is full."""
        if self._abort is not None:
            raise ChannelAborted(self._abort.reason)  # fresh: see abort()
        if self._closed:
            raise RuntimeError(f"put() on closed channel {self.name!r}")
        if self.capacity and len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        if self._getters:
            self._getters.popleft().wake()
        elif self._putters and not self._woken and len(self._items) < self.capacity:
            self._wake_next_putter()  # room is left: pass the wake on
        return True

    def put(self, item: T) -> None:
        """Append ``item``, blocking the calling thread while the channel is full."""
        woken = False
        while True:
            with self._mutex:
                if woken:
                    self._back()
                if self._try_put(item):
                    return
                waiter = ThreadWaiter()
                self._putters.append(waiter)
            try:
                waiter.wait(None)
            except BaseException:
                self._abandon(waiter, self._putters)
                raise
            woken = True

    async def aput(self, item: T) -> None:
        """Append ``item``, suspending the calling coroutine while the channel is full."""
        woken = False
        while True:
            with self._mutex:
                if woken:
                    self._back()
                if self._try_put(item):
                    return
                waiter = AsyncWaiter()
                self._putters.append(waiter)
            await self._await(waiter, self._putters)
            woken = True

    def _wake_putters(self, room: int) -> None:
        """Wake blocked producers for ``room`` free places (under the mutex).

        Filling in bursts (``refill_at`` below ``capacity - 1``), the room is filled by one
        wake of all that fit, made once the producers woken before are back: waking more
        as each get makes room would be one wake per item again. Otherwise one producer is
        woken, once those woken before are back, and it passes the wake on if it leaves
        room (module notes)."""
        if self._woken:
            return
        if self.refill_at < self.capacity - 1:
            more = min(room, len(self._putters))
            self._woken += more
            wake_together([self._putters.popleft() for _ in range(more)])
        else:
            self._wake_next_putter()

    def _back(self) -> None:
        """A putter woken for room is back (under the mutex)."""
        self._woken = max(0, self._woken - 1)

    def close(self, error: BaseException | None = None) -> None:
        """End the stream; readers see ``EOF`` (and ``close_error``) after draining."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self.close_error = error
            wake_every(self._getters, self._putters)

    def abort(self, reason: BaseException | None, *, keep_into: deque[T] | None = None) -> None:
        """Drop all items and make every call raise :class:`ChannelAborted`; with
        ``keep_into`` the items are appended to it instead, for a reader to take on
        purpose. The channel keeps none: the stages that hold it may outlive it in
        reference cycles, and the items (batches, their shared memory) with them."""
        with self._mutex:
            if self._abort is not None:
                return
            # Kept to be copied, never raised itself: one instance raised in every stage
            # thread would gather each thread's traceback, and with it the frames and the
            # items they hold, alive until the cycle collector runs (a persistent loader
            # then waited for batches that only a gc.collect() freed).
            self._abort = ChannelAborted(reason)
            if keep_into is not None:
                keep_into.extend(self._items)
                for segment in self._segments:
                    keep_into.extend(segment)
            self._items.clear()
            for segment in self._segments:
                segment.clear()
            wake_every(self._getters, self._putters)

    # -- consumer side -------------------------------------------------------------------
    def _try_get(self) -> Any:
        """Take without waiting; return the item, EOF, or ``self._mutex`` meaning 'wait'."""
        items = self._items
        if items:
            item = items.popleft()
            self.n_gets += 1
            self.depth_sum += len(items)
            if self._putters and len(items) <= self.refill_at:
                self._wake_putters(self.capacity - len(items))
            if items and self._getters:  # pass the wake on
                self._getters.popleft().wake()
            return item
        if self._abort is not None:
            raise ChannelAborted(self._abort.reason)  # fresh: see abort()
        if self._segments and (staged := self._take_staged(1)):
            return staged[0]
        if self._closed:
            return EOF
        return self._mutex

    def get_nowait(self) -> Any:
        """The next item if one is waiting, else ``EMPTY``; ``EOF`` once closed and drained."""
        with self._mutex:
            item = self._try_get()
        return EMPTY if item is self._mutex else item

    def get(self, timeout: float | None = None) -> T:
        """Take the next item, blocking; ``EOF`` once closed and drained.

        Raises :class:`TimeoutError` when nothing arrives within ``timeout`` seconds.
        """
        deadline = None
        while True:
            with self._mutex:
                item = self._try_get()
                if item is not self._mutex:
                    return item
                waiter = ThreadWaiter()
                if not self._register(waiter):
                    continue
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            try:
                woken = waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:  # KeyboardInterrupt while blocked
                self._abandon(waiter, self._getters)
                raise
            if not woken and self._abandon(waiter, self._getters):
                raise TimeoutError(f"no item arrived from {self.name!r} within {timeout} s")

    async def aget(self) -> T:
        """Take the next item, suspending the coroutine; ``EOF`` once closed and drained."""
        while True:
            with self._mutex:
                item = self._try_get()
                if item is not self._mutex:
                    return item
                waiter = AsyncWaiter()
                if not self._register(waiter):
                    continue
            await self._await(waiter, self._getters)

    async def _await(self, waiter: AsyncWaiter, queue: deque[Waiter]) -> None:
        try:
            await waiter.fut
        except BaseException:
            self._abandon(waiter, queue)
            raise

    def _abandon(self, waiter: Waiter, queue: deque[Waiter]) -> bool:
        """Withdraw a waiter that stops waiting; True if it had not been woken.

        A waiter that was woken but leaves anyway passes its wake on, so none is lost.
        """
        with self._mutex:
            try:
                queue.remove(waiter)
                return True
            except ValueError:
                if queue:
                    queue.popleft().wake()
                elif queue is self._putters:
                    self._back()  # woken for room that no one will take
                return False
