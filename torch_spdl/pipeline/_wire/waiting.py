"""What a channel answers with (``EOF``, ``EMPTY``, ``ChannelAborted``), and what a caller
that must wait for a channel waits on: a lock for a thread, a future for a coroutine.

A waiter is allocated only by a caller that has to wait (the channel's fast path allocates
nothing). Coroutines woken from their own loop's thread are resumed directly, and a
cross-thread wake pays for ``call_soon_threadsafe`` (one per loop for a batch of them).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

__all__ = [
    "EMPTY",
    "EOF",
    "AsyncWaiter",
    "ChannelAborted",
    "ThreadWaiter",
    "Waiter",
    "wake_every",
    "wake_together",
]


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


class ThreadWaiter:
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


class AsyncWaiter:
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


Waiter = ThreadWaiter | AsyncWaiter


def wake_together(waiters: list[Waiter]) -> None:
    """Wake ``waiters``, in order; coroutines waiting on another thread's loop with one
    ``call_soon_threadsafe`` per loop (each call wakes that loop's thread: a system call
    and a GIL hand-off)."""
    me = threading.get_ident()
    remote: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for waiter in waiters:
        if isinstance(waiter, AsyncWaiter) and waiter._thread != me:
            remote.setdefault(waiter._loop, []).append(waiter.fut)
        else:
            waiter.wake()
    for loop, futs in remote.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_resolve_all, futs)


def wake_every(*queues: deque[Waiter]) -> None:
    """Wake every waiter of ``queues`` (the channel closes or aborts: none may stay)."""
    for queue in queues:
        while queue:
            queue.popleft().wake()
