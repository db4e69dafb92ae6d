"""SPDL's queue classes (``AsyncQueue``, ``StatsQueue``) as observers of the engine's channels.

In SPDL every stage boundary is an ``asyncio.Queue`` on one event loop, and
``build(queue_class=...)`` replaces that queue. Here a boundary is a
:class:`~torch_spdl.pipeline._wire.channel.Channel` that threads and coroutines share without a
loop round trip; routing every item through an ``asyncio.Queue`` would undo that. So a
queue class plugs in as an **observer**: ``build`` makes one instance per boundary (with
SPDL's ``name`` and ``buffer_size`` keywords), enters its ``stage_hook()`` on the
pipeline's event loop while the pipeline runs, and the boundary's channel becomes an
:class:`ObservedChannel` that reports how long each ``put`` and ``get`` waited and when
the queue ran empty. :class:`StatsQueue` turns those reports into SPDL's
:class:`QueuePerfStats`. Items never pass through the queue object itself, so a subclass
that overrides ``get``/``put`` is not called on the data path (its ``stage_hook`` and the
stats callbacks are). A pipeline built without ``queue_class`` uses plain channels and
pays nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from .._wire.channel import EMPTY, EOF, Channel

__all__ = ["AsyncQueue", "ObservedChannel", "QueuePerfStats", "StatsQueue", "make_queue"]

_LG = logging.getLogger("torch_spdl.pipeline")


@dataclass
class QueuePerfStats:
    """What a :class:`StatsQueue` measured over a period (the whole run, or an interval).

    Args:
        elapsed: the length of the period in seconds.
        num_items: items taken out of the queue in it.
        ave_put_time: average seconds a ``put`` waited for room (upstream blocked).
        ave_get_time: average seconds a ``get`` waited for an item (downstream starved).
        occupancy_rate: the fraction of the period the queue held at least one item.
    """

    elapsed: float
    num_items: int
    ave_put_time: float
    ave_get_time: float
    occupancy_rate: float

    @property
    def qps(self) -> float:
        """Items per second (``num_items / elapsed``; 0 for an empty period)."""
        return self.num_items / self.elapsed if self.elapsed > 0 else 0.0


class AsyncQueue(asyncio.Queue):
    """SPDL's base queue class: pass a subclass as ``build(queue_class=...)``.

    The engine makes one per stage boundary and enters :meth:`stage_hook` on the
    pipeline's event loop from start to stop (put initialisation and finalisation there).
    It is still an ``asyncio.Queue`` for code that uses it directly, but the pipeline's
    items do not pass through it (see the module notes); :meth:`_observe_put` and
    :meth:`_observe_get` are how the engine reports each hand-off.

    Args:
        name: the boundary's name (assigned by the builder).
        buffer_size: its capacity (assigned by the builder; 0: unbounded).
    """

    def __init__(self, name: str, *, buffer_size: int = 1) -> None:
        super().__init__(buffer_size)
        self.name = name

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Entered when the pipeline starts, left when it stops."""
        yield

    def _observe_put(self, waited: float, now: float) -> None:
        """An item went in after waiting ``waited`` s for room (any thread)."""

    def _observe_get(self, waited: float, now: float) -> None:
        """An item came out after waiting ``waited`` s for it (any thread)."""


class StatsQueue(AsyncQueue):
    """Measures how long the stages on either side of a boundary wait on it.

    At the end of the run it passes the whole run's :class:`QueuePerfStats` to
    :meth:`final_stats_callback` (which logs them); with
    ``interval > 0`` it also calls :meth:`interval_stats_callback` every ``interval``
    seconds with the figures of that interval (override it to send them elsewhere).

    Args:
        name: the boundary's name (assigned by the builder).
        buffer_size: its capacity (assigned by the builder).
        interval: seconds between interval reports (<= 0: none); ``build`` passes its
            ``report_stats_interval``.
    """

    def __init__(self, name: str, *, buffer_size: int = 1, interval: float = -1) -> None:
        super().__init__(name, buffer_size=buffer_size)
        self.interval = interval
        self._lock = threading.Lock()
        self._num_put = self._num_get = 0
        self._put_time = self._get_time = 0.0
        self._empty_since: float | None = None  # None: the queue holds items (or not started)
        self._empty_total = 0.0
        self._t0 = time.monotonic()
        self._lap = (self._t0, 0, 0, 0.0, 0.0, 0.0)  # t, puts, gets, put s, get s, empty s

    def _observe_put(self, waited: float, now: float) -> None:
        with self._lock:
            self._num_put += 1
            self._put_time += waited
            if self._empty_since is not None:
                self._empty_total += now - self._empty_since
                self._empty_since = None

    def _observe_get(self, waited: float, now: float) -> None:
        with self._lock:
            self._num_get += 1
            self._get_time += waited
            if self._num_get >= self._num_put:
                self._empty_since = now

    def _totals(self, now: float) -> tuple[float, int, int, float, float, float]:
        with self._lock:
            empty = self._empty_total
            if self._empty_since is not None:
                empty += now - self._empty_since
            return now, self._num_put, self._num_get, self._put_time, self._get_time, empty

    def _since(self, start: tuple[float, int, int, float, float, float]) -> QueuePerfStats:
        now = self._totals(time.monotonic())
        elapsed = max(now[0] - start[0], 0.0)
        puts, gets = now[1] - start[1], now[2] - start[2]
        empty = now[5] - start[5]
        return QueuePerfStats(
            elapsed=elapsed,
            num_items=gets,
            ave_put_time=(now[3] - start[3]) / puts if puts else 0.0,
            ave_get_time=(now[4] - start[4]) / gets if gets else 0.0,
            occupancy_rate=max(0.0, 1 - empty / elapsed) if elapsed > 0 else 0.0,
        )

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Start measuring; report every ``interval`` s; log the run's figures at the end."""
        self._t0 = time.monotonic()
        with self._lock:
            self._empty_since = self._t0 if self._num_get >= self._num_put else None
        # counts from the first hand-off (the loop may start after the first items moved)
        start = (self._t0, 0, 0, 0.0, 0.0, 0.0)
        self._lap = self._totals(self._t0)
        reporter = None
        if self.interval > 0:
            reporter = asyncio.get_running_loop().create_task(self._report_every())
        try:
            yield
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
            await self.final_stats_callback(self._since(start))

    async def _report_every(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            start, self._lap = self._lap, self._totals(time.monotonic())
            try:
                await self.interval_stats_callback(self._since(start))
            except Exception as exc:  # a reporting error must not stop the reports
                _LG.error("queue %r: interval_stats_callback failed: %r", self.name, exc)

    async def interval_stats_callback(self, stats: QueuePerfStats) -> None:
        """Called every ``interval`` s with that interval's figures; logs them by default."""
        self._log(stats)

    async def final_stats_callback(self, stats: QueuePerfStats) -> None:
        """Called once as the pipeline stops with the whole run's figures; logs them by
        default (SPDL's thread output queue has the same callback)."""
        self._log(stats)

    def _log(self, stats: QueuePerfStats) -> None:
        _LG.info(
            "[%s] %d items in %.3f s (%.1f/s); waited on average: put %.2g s, get %.2g s; "
            "occupied %d%% of the time",
            self.name,
            stats.num_items,
            stats.elapsed,
            stats.qps,
            stats.ave_put_time,
            stats.ave_get_time,
            round(100 * stats.occupancy_rate),
        )


class ObservedChannel(Channel[Any]):
    """A channel that reports each hand-off to a queue object (only with ``queue_class``)."""

    __slots__ = ("observer",)

    def __init__(
        self, capacity: int, name: str, observer: AsyncQueue, *, refill_at: int | None = None
    ) -> None:
        super().__init__(capacity, name, refill_at=refill_at)
        self.observer = observer

    bulk = False  # each hand-off is observed: one by one

    def put(self, item: Any) -> None:
        t0 = time.monotonic()
        super().put(item)
        now = time.monotonic()
        self.observer._observe_put(now - t0, now)

    async def aput(self, item: Any) -> None:
        t0 = time.monotonic()
        await super().aput(item)
        now = time.monotonic()
        self.observer._observe_put(now - t0, now)

    def get(self, timeout: float | None = None) -> Any:
        t0 = time.monotonic()
        item = super().get(timeout)
        if item is not EOF:
            now = time.monotonic()
            self.observer._observe_get(now - t0, now)
        return item

    async def aget(self) -> Any:
        t0 = time.monotonic()
        item = await super().aget()
        if item is not EOF:
            now = time.monotonic()
            self.observer._observe_get(now - t0, now)
        return item

    def get_nowait(self) -> Any:
        item = super().get_nowait()
        if item is not EOF and item is not EMPTY:
            self.observer._observe_get(0.0, time.monotonic())
        return item


def make_queue(
    queue_class: type[AsyncQueue], name: str, capacity: int, interval: float
) -> AsyncQueue:
    """One observer for one boundary, made the way SPDL's builder makes its queues."""
    if not (isinstance(queue_class, type) and issubclass(queue_class, AsyncQueue)):
        raise TypeError(
            f"queue_class must be a subclass of torch_spdl.pipeline.AsyncQueue (the class, "
            f"not an instance), got {queue_class!r}"
        )
    if issubclass(queue_class, StatsQueue):
        return queue_class(name, buffer_size=capacity, interval=interval)
    return queue_class(name, buffer_size=capacity)


def queue_hooks_task(queues: list[AsyncQueue]) -> Callable[[], Any]:
    """A background-task factory that holds every queue's ``stage_hook()`` open from
    start to stop (on the pipeline's event loop); a hook that fails is logged."""
    from .background import BackgroundTask

    class _QueueHooks(BackgroundTask):
        async def run(self) -> None:
            stack = contextlib.AsyncExitStack()
            try:
                for queue in queues:
                    await stack.enter_async_context(queue.stage_hook())
                await asyncio.get_running_loop().create_future()  # until stop cancels it
            except asyncio.CancelledError:
                # the pipeline stopped: leave the hooks as a stage ends (no exception in
                # them), then let the cancellation go on
                await stack.aclose()
                raise
            except BaseException:
                await stack.aclose()
                raise

    return _QueueHooks
