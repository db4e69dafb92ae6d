"""The bulk half of :class:`~.channel.Channel`: takes of every ready item, and producers'
staged segments (the channel's notes say why and how; split off for size).

:class:`BulkEnds` is a mixin of ``Channel`` only: it works on the channel's own state
(declared here for the type checker) under the channel's mutex.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from .waiting import EOF, AsyncWaiter, ChannelAborted, ThreadWaiter, Waiter

__all__ = ["MAX_ROOM", "BulkEnds"]

T = TypeVar("T")

MAX_ROOM = 256  # room() of an unbounded channel


class BulkEnds(Generic[T]):
    """Bulk takes (``get_many``), staged segments (``staging``, ``flush``) and the wake
    passed from producer to producer."""

    bulk = True  # producers may stage and readers take in bulk (ObservedChannel: False)

    name: str
    capacity: int
    refill_at: int
    _items: deque[T]
    _mutex: threading.Lock
    _getters: deque[Waiter]
    _putters: deque[Waiter]
    _woken: int
    _closed: bool
    _abort: ChannelAborted | None
    n_gets: int
    depth_sum: int
    _segments: list[deque[T]]

    # the channel's own, for the type checker
    _back: Callable[[], None]
    _wake_putters: Callable[[int], None]
    _await: Callable[[AsyncWaiter, deque[Waiter]], Awaitable[None]]
    _abandon: Callable[[Waiter, deque[Waiter]], bool]

    def _wake_next_putter(self) -> None:
        self._woken += 1
        self._putters.popleft().wake()

    # -- staged segments (channel.py's notes) ---------------------------------------------
    def staging(self) -> deque[T]:
        """A segment for one producer to stage its items in (``append``; then, if
        :meth:`has_readers_waiting`, :meth:`flush`). Only that producer appends to it."""
        segment: deque[T] = deque()
        with self._mutex:
            self._segments.append(segment)
        return segment

    def has_readers_waiting(self) -> bool:
        """Whether a producer should flush now: a reader waits, or the channel was aborted
        (the flush raises, so a producer never stages on after the pipeline stopped)."""
        return bool(self._getters) or self._abort is not None

    def room(self) -> int:
        """Free places now (at least 1; ``MAX_ROOM`` when unbounded): the most items a
        producer takes in hand for this channel, so that once it is full each producer
        holds one item, as before (read without the lock: a hint)."""
        if not self.capacity:
            return MAX_ROOM
        return max(1, self.capacity - len(self._items))

    def flush(self, segment: deque[T]) -> None:
        """Move ``segment``'s items into the queue, blocking while it is full (readers may
        take from the segment meanwhile)."""
        woken = False
        while True:
            with self._mutex:
                if woken:
                    self._back()
                if not self._move(segment):
                    return
                waiter = ThreadWaiter()
                self._putters.append(waiter)
            try:
                waiter.wait(None)
            except BaseException:
                self._abandon(waiter, self._putters)
                raise
            woken = True

    async def aflush(self, segment: deque[T]) -> None:
        """:meth:`flush` for a coroutine."""
        woken = False
        while True:
            with self._mutex:
                if woken:
                    self._back()
                if not self._move(segment):
                    return
                waiter = AsyncWaiter()
                self._putters.append(waiter)
            await self._await(waiter, self._putters)
            woken = True

    def _move(self, segment: deque[T]) -> bool:
        """Move what fits of ``segment`` into the queue (under the mutex); True while some
        is left (the queue is full)."""
        items, n = self._items, len(segment)
        if not n:  # readers took it all meanwhile; a wake for room goes on
            if self._putters and not self._woken and len(items) < self.capacity:
                self._wake_next_putter()
            return False
        if self._abort is not None:
            # Staged after abort() dropped the rest: dropped too, or the segment, which the
            # channel keeps, would hold them (a failed loader's batches and their arenas).
            segment.clear()
            raise ChannelAborted(self._abort.reason)  # fresh: see abort()
        if self._closed:
            raise RuntimeError(f"put() on closed channel {self.name!r}")
        room = self.capacity - len(items) if self.capacity else n
        if room >= n:
            items.extend(segment)
            segment.clear()
        else:
            popleft = segment.popleft
            for _ in range(max(room, 0)):
                items.append(popleft())
        if room > 0:
            if self._getters:
                self._getters.popleft().wake()  # a reader that leaves items wakes the next
            elif self._putters and not self._woken and len(items) < self.capacity:
                self._wake_next_putter()
        return bool(segment)

    def _take_staged(self, limit: int) -> list[T]:
        """Up to ``limit`` staged items, oldest segment first (under the mutex, queue empty)."""
        out: list[T] = []
        for segment in self._segments:
            while segment and len(out) < limit:
                out.append(segment.popleft())
            if len(out) >= limit:
                break
        if out:
            self.n_gets += len(out)  # taken from hand: nothing was waiting in the queue
        return out

    def _try_get_many(self, limit: int) -> Any:
        """:meth:`_try_get` for up to ``limit`` items: a list, EOF, or ``self._mutex``."""
        items = self._items
        if items:
            n = len(items)
            k = min(limit, n)
            if k == n:
                out = list(items)
                items.clear()
            else:
                popleft = items.popleft
                out = [popleft() for _ in range(k)]
            self.n_gets += k
            self.depth_sum += k * n - k * (k + 1) // 2  # as if taken one by one
            if self._putters and len(items) <= self.refill_at:
                self._wake_putters(self.capacity - len(items))
            if items and self._getters:  # pass the wake on
                self._getters.popleft().wake()
            return out
        if self._abort is not None:
            raise ChannelAborted(self._abort.reason)  # fresh: see abort()
        if self._segments and (staged := self._take_staged(limit)):
            return staged
        if self._closed:
            return EOF
        return self._mutex

    def _register(self, waiter: Waiter) -> bool:
        """Add a waiting reader (under the mutex); False, withdrawn again, when a producer
        staged an item meanwhile (module notes: the reader registers, then looks)."""
        self._getters.append(waiter)
        if any(self._segments):
            self._getters.pop()
            return False
        return True

    def get_many(self, limit: int, timeout: float | None = None) -> Any:
        """Take up to ``limit`` ready items as a list, blocking until there is one;
        ``EOF`` once closed and drained. ``TimeoutError`` as :meth:`get`."""
        deadline = None
        while True:
            with self._mutex:
                items = self._try_get_many(limit)
                if items is not self._mutex:
                    return items
                waiter = ThreadWaiter()
                if not self._register(waiter):
                    continue
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            try:
                woken = waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:
                self._abandon(waiter, self._getters)
                raise
            if not woken and self._abandon(waiter, self._getters):
                raise TimeoutError(f"no item arrived from {self.name!r} within {timeout} s")

    async def aget_many(self, limit: int) -> Any:
        """:meth:`get_many` for a coroutine."""
        while True:
            with self._mutex:
                items = self._try_get_many(limit)
                if items is not self._mutex:
                    return items
                waiter = AsyncWaiter()
                if not self._register(waiter):
                    continue
            await self._await(waiter, self._getters)
