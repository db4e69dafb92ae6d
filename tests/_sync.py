"""Synchronisation helpers shared by the engine tests (events, never sleeps)."""

from __future__ import annotations

import asyncio
import threading

# Hang guards, never measures: a correct run ends long before them, and a bug fails at them
# instead of hanging. A guard that fires on a slow day is a flaky test: CI machines have run
# 10-20x slower than a quiet one (a 50-70 s `import torch`, a docs build over 4 minutes).
WAIT = 10.0  # any wait for an event inside a test (some tests' worker processes sit it out)
CHILD_START_S = 300.0  # a wait that includes a child interpreter's start (spawn, imports)
CHILD_S = 1500.0  # one child interpreter's whole run: an example, the docs build, a CLI call


class Gate:
    """A one-shot event that both threads and coroutines (on any loop) can wait on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed already
                pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float = WAIT) -> bool:
        return self._event.wait(timeout)

    async def await_(self, timeout: float = WAIT) -> bool:
        with self._lock:
            if self._event.is_set():
                return True
            event = asyncio.Event()
            self._async_waiters.append((asyncio.get_running_loop(), event))
        waiter = asyncio.ensure_future(event.wait())
        done, _ = await asyncio.wait({waiter}, timeout=timeout)  # no TimeoutError: 3.10-safe
        if not done:
            waiter.cancel()
        return bool(done)

    def gated_op(self, kind: str):
        """An identity op ("sync" or "async") that waits for this gate before returning."""

        def blocked(x):
            assert self.wait(30)
            return x

        async def ablocked(x):
            assert await self.await_(30)
            return x

        return blocked if kind == "sync" else ablocked
