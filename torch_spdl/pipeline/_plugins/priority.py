"""SPDL's priority executors: one pool shared by several stages, later stages first.

When several stages share one pool, work of the stages nearer the sink should run first:
it frees memory and feeds the consumer, while work of early stages only fills queues. A
priority pool keeps the tasks that wait in a heap ordered by priority (then by arrival) and
hands at most ``max_workers`` of them at a time to an ordinary thread or process pool,
so whatever waits is always started in priority order. Each stage gets its own
:class:`PriorityExecutorEntrypoint` from :meth:`get_executor`; entrypoints made later get a
higher priority unless one is given. Entrypoints pickle (for
``run_pipeline_in_subprocess``): in the receiving process the first one of a pool makes an
equal pool there, and the others share it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from functools import partial
from typing import Any

__all__ = [
    "PriorityExecutorEntrypoint",
    "PriorityProcessPoolExecutor",
    "PriorityThreadPoolExecutor",
]


class _PriorityPool:
    """The shared part: the heap of waiting tasks and the pool that runs them."""

    kind = ""

    def __init__(self, max_workers: int | None, pool: Executor, pool_id: str | None) -> None:
        self._pool = pool
        self.max_workers: int = getattr(pool, "_max_workers", None) or max_workers or 1
        self._id = pool_id or uuid.uuid4().hex
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, Callable[..., Any], tuple[Any, ...], dict, Future]] = []
        self._seq = itertools.count()
        self._running = 0
        self._next_priority = 0
        self._shutdown = False
        _REGISTRY[self._id] = self

    def get_executor(self, *, priority: int | None = None) -> PriorityExecutorEntrypoint:
        """An executor for one stage: its tasks run before those of lower priority.

        Args:
            priority: larger runs first (default: higher than every entrypoint made so far).
        """
        with self._lock:
            if priority is None:
                priority = self._next_priority
            self._next_priority = max(self._next_priority, priority) + 1
        return PriorityExecutorEntrypoint(self, priority)

    def _submit(
        self, priority: int, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict
    ) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a priority pool after shutdown()")
            heapq.heappush(self._heap, (-priority, next(self._seq), fn, args, kwargs, future))
        self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Hand the best waiting tasks to the pool while it has a free worker."""
        while True:
            with self._lock:
                if self._running >= self.max_workers or not self._heap:
                    return
                _, _, fn, args, kwargs, future = heapq.heappop(self._heap)
                if not future.set_running_or_notify_cancel():
                    continue  # cancelled while waiting
                self._running += 1
            try:
                inner = self._pool.submit(fn, *args, **kwargs)
            except BaseException as exc:
                with self._lock:
                    self._running -= 1
                future.set_exception(exc)
                continue
            inner.add_done_callback(partial(self._done, future=future))

    def _done(self, inner: Future, future: Future) -> None:
        with self._lock:
            self._running -= 1
        exc = inner.exception() if not inner.cancelled() else RuntimeError("task cancelled")
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(inner.result())
        self._dispatch()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop taking tasks; with ``cancel_futures`` drop those still waiting."""
        with self._lock:
            self._shutdown = True
            waiting, self._heap = (self._heap, []) if cancel_futures else ([], self._heap)
        for *_, future in waiting:
            future.cancel()
        if wait:  # what still waits must reach the pool before the pool shuts
            with self._lock:
                pending = [entry[-1] for entry in self._heap]
            futures_wait(pending)
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        _REGISTRY.pop(self._id, None)

    def __enter__(self) -> _PriorityPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


_REGISTRY: dict[str, _PriorityPool] = {}


class PriorityThreadPoolExecutor(_PriorityPool):
    """A thread pool whose waiting tasks run in priority order.

    Args:
        max_workers: the number of threads.
        thread_name_prefix: the threads' name prefix.
        initializer: run once in each thread before its first task.
        initargs: the initializer's arguments.
    """

    kind = "thread"

    def __init__(
        self,
        max_workers: int | None = None,
        thread_name_prefix: str = "",
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        _pool_id: str | None = None,
    ) -> None:
        pool = ThreadPoolExecutor(max_workers, thread_name_prefix, initializer, initargs)
        super().__init__(max_workers, pool, _pool_id)


class PriorityProcessPoolExecutor(_PriorityPool):
    """A process pool whose waiting tasks run in priority order.

    Args:
        max_workers: the number of processes.
        kwargs: passed to ``concurrent.futures.ProcessPoolExecutor``.
    """

    kind = "process"

    def __init__(
        self, max_workers: int | None = None, *, _pool_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(max_workers, ProcessPoolExecutor(max_workers, **kwargs), _pool_id)


def _entrypoint(pool_id: str, kind: str, max_workers: int, priority: int) -> Any:
    """Unpickle an entrypoint: the first of a pool in this process makes an equal pool."""
    pool = _REGISTRY.get(pool_id)
    if pool is None:
        cls = PriorityThreadPoolExecutor if kind == "thread" else PriorityProcessPoolExecutor
        pool = cls(max_workers, _pool_id=pool_id)
    return PriorityExecutorEntrypoint(pool, priority)


class PriorityExecutorEntrypoint(Executor):
    """One stage's view of a priority pool (from ``get_executor``): an ``Executor``."""

    def __init__(self, owner: _PriorityPool, priority: int) -> None:
        self.owner = owner
        self.priority = priority

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return self.owner._submit(self.priority, fn, args, kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Does nothing: the pool is shared; shut it down with its own ``shutdown()``."""

    def __reduce__(self) -> tuple[Any, ...]:
        owner = self.owner
        return (_entrypoint, (owner._id, owner.kind, owner.max_workers, self.priority))

    def __repr__(self) -> str:
        return f"PriorityExecutorEntrypoint({type(self.owner).__name__}, priority={self.priority})"
