"""What one item costs in an autotuned stage: wall time and CPU time inside its op.

The first step of the tuner is a model (Little's law), which needs per-item costs: the
wall time tells how many workers keep up with a rate, the CPU time how many the CPU budget
pays for. Only autotuned stages are metered, by wrapping their op once when the pipeline
starts, so a stage with a fixed concurrency runs exactly the loop it ran before.

- A sync op (function or generator) on a worker thread: ``time.thread_time`` around the
  call, the CPU of that thread alone (time spent blocked in I/O or waiting for the GIL is
  not counted).
- An async op: the CPU time of the loop's thread *between the coroutine's await points*,
  taken by driving the coroutine step by step; the time it spends suspended is not its own.
  Until the first metered call finishes, the calls in flight are counted too, with when
  the first one started (:meth:`StageMeter.waiting`): how long they have waited at how
  little CPU is then the only evidence there is, and a model step that waits for the first
  items to finish (5 ms for a 5 ms sleep) loses a tenth of a 3,000-item run.
- An async generator: the wall time only (its CPU is not attributed; the model then uses
  the process's CPU).

Each thread adds to its own cell (no lock on the hot path); readers sum the cells. After
its first :data:`EVERY_ITEM` calls, a worker meters one call in ``stride`` (the others run
the bare op, and are only counted): per-item costs are averages, and the meter's own cost
(a few clock reads; for an async op, driving the coroutine step by step) then stays a
small fraction of a fast op. The stride starts at :data:`SAMPLE_EVERY` and is paced to
about one metered call per :data:`PACE` seconds per worker: a fixed one in 8 metered 5,000
calls a second on an event loop running 256 coroutines at 40,000 items a second, and cost
its thread 1 us per item (10% of its CPU, 2% of the rate against the same stage at a fixed
concurrency); paced, a 0.3 s window still sees hundreds of metered calls. Which calls are
metered depends on how many came before, not on what they cost, so the average stays fair.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["EVERY_ITEM", "SAMPLE_EVERY", "StageMeter"]

EVERY_ITEM = 16
SAMPLE_EVERY = 8  # the least stride
MAX_STRIDE = 1024
PACE = 0.001  # seconds between metered calls of one worker, about


class _Cell:
    __slots__ = ("calls", "items", "wall", "cpu", "open", "first", "stride", "last")

    def __init__(self) -> None:
        self.calls = 0  # every call, metered or not
        self.items = 0  # metered calls
        self.wall = 0.0
        self.cpu = 0.0
        self.open = 0  # metered async calls in flight
        self.first = 0.0  # when the first metered async call started (0: none yet)
        self.stride = SAMPLE_EVERY  # past the first calls, one call in this many is metered
        self.last = 0.0  # when the last metered call started

    def skip(self) -> bool:
        """Count a call; True when it is not to be metered."""
        self.calls = n = self.calls + 1
        return n > EVERY_ITEM and n % self.stride != 0

    def pace(self, now: float) -> None:
        """A metered call starts at ``now``: double the stride when metered calls come
        more than twice as often as :data:`PACE`, halve it when less than half as often.
        (Doubling keeps the calls metered at a multiple of the old stride.)"""
        gap, self.last = now - self.last, now
        if self.calls <= EVERY_ITEM:
            return
        if gap < PACE / 2 and self.stride < MAX_STRIDE:
            self.stride *= 2
        elif gap > 2 * PACE and self.stride > SAMPLE_EVERY:
            self.stride //= 2


class StageMeter:
    """Per-item wall and CPU seconds of one stage's op, summed over its workers."""

    def __init__(self) -> None:
        self._cells: list[_Cell] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self.measures_cpu = True

    def _cell(self) -> _Cell:
        try:
            return self._local.cell
        except AttributeError:
            cell = self._local.cell = _Cell()
            with self._lock:
                self._cells.append(cell)
            return cell

    def totals(self) -> tuple[int, int, float, float | None]:
        """Items done; how many calls were metered to their end; and the wall and CPU
        seconds (None: not measured) those metered calls took.

        While a worker meters every call (its first ones, which the model reads) its count
        of items is exact; after that its calls are counted as they start. The costs are
        not scaled up to the items: over a window, the metered seconds divided by the
        metered calls is the cost per item, both counting calls that finished in it. (Scaled
        by the calls *started*, as before, a short window right after the storage got
        slower mixed the two: it read 4.5 ms per item where items took 16.)"""
        with self._lock:
            cells = list(self._cells)
        metered = sum(c.items for c in cells)
        done = sum(c.items if c.calls <= EVERY_ITEM else c.calls for c in cells)
        wall = sum(c.wall for c in cells)
        cpu = sum(c.cpu for c in cells) if self.measures_cpu else None
        return done, metered, wall, cpu

    def waiting(self) -> tuple[int, float] | None:
        """Until the first metered call of an async op finishes: how many are in flight and
        when the first one started (``time.perf_counter``). None after that, and for a sync
        op (its thread's CPU cannot be read before its call returns)."""
        with self._lock:
            cells = list(self._cells)
        starts = [c.first for c in cells if c.first]
        if not starts or any(c.items for c in cells):
            return None
        return sum(c.open for c in cells), min(starts)

    # -- wrappers ------------------------------------------------------------------------
    def wrap_sync(self, op: Callable[[Any], Any], *, generator: bool) -> Callable[[Any], Any]:
        """``op`` (run on worker threads) adding its wall and thread CPU time per call."""
        cell_of, wall, cpu = self._cell, time.perf_counter, time.thread_time

        if generator:

            def metered_gen(item: Any) -> Any:
                cell = cell_of()
                if cell.skip():
                    yield from op(item)
                    return
                t0, c0 = wall(), cpu()
                cell.pace(t0)
                try:
                    yield from op(item)
                finally:
                    cell.cpu += cpu() - c0
                    cell.wall += wall() - t0
                    cell.items += 1

            return metered_gen

        def metered(item: Any) -> Any:
            cell = cell_of()
            if cell.skip():
                return op(item)
            t0, c0 = wall(), cpu()
            cell.pace(t0)
            try:
                return op(item)
            finally:
                cell.cpu += cpu() - c0
                cell.wall += wall() - t0
                cell.items += 1

        return metered

    def wrap_async(self, op: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """An async function ``op`` whose calls count the CPU time between await points."""
        cell_of = self._cell

        def metered(item: Any) -> Any:
            cell = cell_of()
            if cell.skip():
                return op(item)
            return _Metered(op(item), cell)  # op(item) raising: the stage's error

        return metered

    def wrap_async_gen(self, op: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """An async generator ``op``, wall time per call only."""
        self.measures_cpu = False
        cell_of, wall = self._cell, time.perf_counter

        async def metered_agen(item: Any) -> Any:
            cell = cell_of()
            if cell.skip():
                async for out in op(item):
                    yield out
                return
            t0 = wall()
            cell.pace(t0)
            try:
                async for out in op(item):
                    yield out
            finally:
                cell.wall += wall() - t0
                cell.items += 1

        return metered_agen


class _Metered:
    """An awaitable running a coroutine one step at a time, timing each step."""

    __slots__ = ("_awaitable", "_cell")

    def __init__(self, awaitable: Any, cell: _Cell) -> None:
        self._awaitable = awaitable
        self._cell = cell

    def __await__(self) -> Generator[Any, Any, Any]:
        return _drive(self._awaitable.__await__(), self._cell)


def _drive(steps: Any, cell: _Cell) -> Generator[Any, Any, Any]:
    cpu, wall = time.thread_time, time.perf_counter
    start = wall()
    cell.pace(start)
    if not cell.first:
        cell.first = start
    cell.open += 1
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            c0 = cpu()
            try:
                if error is None:
                    yielded = steps.send(value)
                else:
                    yielded = steps.throw(error)
            except StopIteration as done:
                return done.value
            finally:
                cell.cpu += cpu() - c0
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # cancellation: deliver it to the coroutine
                value, error = None, exc
    finally:
        cell.wall += wall() - start
        cell.open -= 1
        cell.items += 1
