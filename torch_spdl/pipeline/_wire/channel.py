"""A bounded queue that threads and coroutines can both read and write.

Stages of one pipeline run on worker threads (sync ops) or on the pipeline's event loop
(async ops), so the queue between two stages must serve either kind on either end. The fast
path (the queue is neither empty nor full) is one uncontended lock and one deque operation;
only a caller that must wait allocates a waiter, and a put wakes exactly one waiting
reader. Coroutines woken from their own loop's thread are resumed directly, and only a
cross-thread wake pays for ``call_soon_threadsafe`` (one per loop for a batch of them).

A producer blocked on a full channel is woken by the get that leaves at most ``refill_at``
items: by default the first get that makes room, one producer per place. A channel
between the loop and a thread refills in bursts instead (``refill_at`` at half): its
producers are woken once it is half empty, all that fit at once. Each wake there crosses
threads: a source feeding coroutines would be handed the GIL once per key, which at tens
of thousands of items a second was a third of the process's CPU; coroutines feeding the
consumer's thread would wake the loop once per item.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["EMPTY", "EOF", "Channel", "ChannelAborted"]


class _EndOfStream:
    """Returned by ``get`` once the channel is closed and drained."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EOF"


EOF: Any = _EndOfStream()
EMPTY: Any = object()  # get_nowait: nothing waiting


class ChannelAborted(Exception):
    """Raised to every user of a channel after :meth:`Channel.abort`; carries the reason."""

    def __init__(self, reason: BaseException | None) -> None:
        super().__init__(reason)
        self.reason = reason


class _ThreadWaiter:
    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self) -> None:
        self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _resolve_all(futs: list[asyncio.Future[None]]) -> None:
    for fut in futs:
        _resolve(fut)


class _AsyncWaiter:
    __slots__ = ("fut", "_loop", "_thread")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self.fut: asyncio.Future[None] = self._loop.create_future()

    def wake(self) -> None:
        if threading.get_ident() == self._thread:
            _resolve(self.fut)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_resolve, self.fut)


_Waiter = _ThreadWaiter | _AsyncWaiter


def _wake_together(waiters: list[_Waiter]) -> None:
    """Wake ``waiters``, in order; coroutines waiting on another thread's loop with one
    ``call_soon_threadsafe`` per loop (each call wakes that loop's thread: a system call
    and a GIL hand-off)."""
    me = threading.get_ident()
    remote: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for waiter in waiters:
        if isinstance(waiter, _AsyncWaiter) and waiter._thread != me:
            remote.setdefault(waiter._loop, []).append(waiter.fut)
        else:
            waiter.wake()
    for loop, futs in remote.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_resolve_all, futs)


def _wake_every(*queues: deque[_Waiter]) -> None:
    """Wake every waiter of ``queues`` (the channel closes or aborts: none may stay)."""
    for queue in queues:
        while queue:
            queue.popleft().wake()


class Channel(Generic[T]):
    """Bounded multi-producer multi-consumer queue with sync and async ends.

    ``capacity <= 0`` means unbounded. ``close(error)`` marks the end of the stream: readers
    drain what is left, then receive :data:`EOF` and can read ``close_error``.
    ``abort(reason)`` discards everything (or, with ``keep_items``, sets it aside in
    ``kept``) and makes every pending and later call raise :class:`ChannelAborted`.
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
        "kept",
    )

    def __init__(self, capacity: int, name: str = "", *, refill_at: int | None = None) -> None:
        self.name = name
        self.capacity = capacity if capacity > 0 else 0
        # a blocked putter is woken once at most this many items remain
        last = self.capacity - 1
        self.refill_at = last if refill_at is None else max(0, min(refill_at, last))
        self._items: deque[T] = deque()
        self._mutex = threading.Lock()
        self._getters: deque[_Waiter] = deque()
        self._putters: deque[_Waiter] = deque()
        self._woken = 0  # putters woken for room that have not come back to put yet
        self._closed = False
        self.close_error: BaseException | None = None
        self._abort: ChannelAborted | None = None
        # Occupancy seen by readers: the sum of queue depths at each successful get.
        self.n_gets = 0
        self.depth_sum = 0
        self.kept: deque[T] = deque()  # what abort(keep_items=True) set aside

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
                waiter = _ThreadWaiter()
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
                waiter = _AsyncWaiter()
                self._putters.append(waiter)
            await self._await(waiter, self._putters)
            woken = True

    def _wake_putters(self, room: int) -> None:
        """Wake blocked producers for ``room`` free places (under the mutex).

        Filling in bursts (``refill_at`` below ``capacity - 1``), the room is filled by one
        wake of all that fit, made once the producers woken before are back: waking more
        as each get makes room would be one wake per item again. Otherwise each get wakes
        one producer for the place it made (room less those woken and not back yet)."""
        if self.refill_at < self.capacity - 1:
            more = 0 if self._woken else room
        else:
            more = room - self._woken
        more = min(more, len(self._putters))
        if more == 1:  # one get, one place: the usual case between threads
            self._woken += 1
            self._putters.popleft().wake()
        elif more > 1:
            self._woken += more
            _wake_together([self._putters.popleft() for _ in range(more)])

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
            _wake_every(self._getters, self._putters)

    def abort(self, reason: BaseException | None, *, keep_items: bool = False) -> None:
        """Drop all items and make every call raise :class:`ChannelAborted`; with
        ``keep_items`` the items move to ``kept`` instead, for a reader to take on purpose."""
        with self._mutex:
            if self._abort is not None:
                return
            # Kept to be copied, never raised itself: one instance raised in every stage
            # thread would gather each thread's traceback, and with it the frames and the
            # items they hold, alive until the cycle collector runs (a persistent loader
            # then waited for batches that only a gc.collect() freed).
            self._abort = ChannelAborted(reason)
            if keep_items:
                self.kept = self._items
                self._items = deque()
            else:
                self._items.clear()
            _wake_every(self._getters, self._putters)

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
            return item
        if self._abort is not None:
            raise ChannelAborted(self._abort.reason)  # fresh: see abort()
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
                waiter = _ThreadWaiter()
                self._getters.append(waiter)
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
                waiter = _AsyncWaiter()
                self._getters.append(waiter)
            await self._await(waiter, self._getters)

    async def _await(self, waiter: _AsyncWaiter, queue: deque[_Waiter]) -> None:
        try:
            await waiter.fut
        except BaseException:
            self._abandon(waiter, queue)
            raise

    def _abandon(self, waiter: _Waiter, queue: deque[_Waiter]) -> bool:
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
