"""How far a stream reads ahead of the samples it hands out: as far as the consumer needs.

A worker that reads sixteen shards ahead while it decodes the first one spends its cores
and memory on bytes it will not touch for seconds. Over HTTP with 20 ms per request, 2
workers, 2 cores, a stream that let 16 reads run from its first batch on delivered that
batch at 0.34-0.53 s and its sixth at 0.6 s; read one at a time, 0.17-0.20 s and 0.4 s,
with the same throughput after. So a read starts only when the consumer needs it soon:

- a *unit* is one ranged read whose bytes the tar splitter will take (a chunk, or a
  shard's first read), or the fetch of a shard into the local cache; units are ordered as
  the splitter takes them (shard order, then offset);
- a unit starts when fewer than ``window`` units are read ahead of the splitter (started
  and not yet taken by it), or when it is the next unit the splitter needs, whatever the
  window (so the stream never waits on itself);
- the window starts at 1 (the unit after the one being split) and doubles, up to
  ``read_concurrency``, each time the splitter has finished its chunk and the next one
  has not arrived: the store is slower than the consumer, so more reads are kept in
  flight to cover its latency, as TCP's slow start opens its window on demand.

The first shard is thereby read alone (16 reads started at once share the bandwidth, and
the first, which the first batch needs, arrives when they all nearly have), and a consumer
that decodes slower than the store reads keeps one unit ahead: memory near two units.

The gate lives on the pipeline's event loop; the splitter runs on a thread of its own and
reports what it took with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["ReadAhead"]

Key = tuple[int, int, int]  # (task's place in the stream, byte offset, 0: fetch / 1: read)


class ReadAhead:
    """The gate a stream's reads pass through (see the module's docstring).

    Args:
        tasks: the stream's tasks in the order the splitter takes them.
        most: the widest the window opens (``read_concurrency``).
    """

    def __init__(self, tasks: Sequence[Any], most: int) -> None:
        self._place = {id(task): i for i, task in enumerate(tasks)}
        self.most = max(1, most)
        self.window = 1
        self._started: dict[Key, bool] = {}  # started, not yet taken: whether it is done
        self._waiting: list[tuple[Key, asyncio.Future[None]]] = []
        self._taken_any = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def key(self, task: Any, offset: int, fetch: bool = False) -> Key:
        """The unit of ``task`` that starts at byte ``offset`` (``fetch``: into the cache)."""
        return (self._place[id(task)], offset, 0 if fetch else 1)

    @asynccontextmanager
    async def unit(self, key: Key) -> AsyncIterator[None]:
        """Wait for ``key``'s turn, then hold it while the body reads."""
        self._loop = asyncio.get_running_loop()
        if not self._may_start(key):
            future = self._loop.create_future()
            self._waiting.append((key, future))
            self._waiting.sort(key=lambda w: w[0])
            try:
                await future
            except BaseException:
                if not future.done():
                    self._waiting = [w for w in self._waiting if w[1] is not future]
                else:  # let in while being cancelled: not started after all
                    self._started.pop(key, None)
                    self._admit()
                raise
        else:
            self._started[key] = False
        try:
            yield
        except BaseException:
            self._started.pop(key, None)
            self._admit()
            raise
        if key in self._started:
            self._started[key] = True

    # -- from the splitter's thread -------------------------------------------------------
    def taken(self, task: Any, offset: int) -> None:
        """The splitter has the chunk of ``task`` at ``offset`` (and so all before it)."""
        self._from_thread(self._on_taken, self.key(task, offset))

    def idle(self) -> None:
        """The splitter has finished its chunk and asks for the next."""
        self._from_thread(self._on_idle)

    def _from_thread(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop has closed: the stream is over
            pass

    # -- on the loop ----------------------------------------------------------------------
    def _may_start(self, key: Key) -> bool:
        if len(self._started) < self.window:
            return True
        return all(key < other for other in self._started)  # the splitter needs it next

    def _admit(self) -> None:
        while self._waiting:
            key, future = self._waiting[0]
            if future.done():  # cancelled
                self._waiting.pop(0)
                continue
            if not self._may_start(key):
                return
            self._waiting.pop(0)
            self._started[key] = False
            future.set_result(None)

    def _on_taken(self, key: Key) -> None:
        self._taken_any = True
        for started in [k for k in self._started if k <= key]:
            del self._started[started]
        self._admit()

    def _on_idle(self) -> None:
        if not self._taken_any:
            return  # before the first chunk, waiting is the stream's start, not a lag
        if not self._started:
            return  # the next unit is not asked for yet (or the stream is over)
        if self._started[min(self._started)]:
            return  # the next chunk is read and on its way
        self.window = min(self.window * 2, self.most)
        self._admit()
