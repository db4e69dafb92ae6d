"""A stage that runs an async op (coroutine or async generator) on the pipeline's loop.

``workers`` coroutines each loop: await an item, await the op, await the put. They never
leave the event loop, so an item moves between two async stages without a thread hop.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ._channel import EOF, ChannelAborted
from ._node import OpStage
from ._ops import OpKind

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["AsyncStage"]


class AsyncStage(OpStage):
    """Async op on ``workers`` coroutines, in completion or input order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._emitting = False
        self._window: asyncio.Semaphore | None = None  # see ThreadStage._window

    def launch(self, runtime: Runtime) -> None:
        for _ in range(self.workers):
            runtime.spawn_task(self._work)

    async def _work(self) -> None:
        counters = self.new_counters()
        try:
            if self.ordered or self.kind is OpKind.ASYNC_GEN:
                await self._run_general(counters)
            else:
                await self._run_fast(counters)
        except ChannelAborted:
            pass
        except Exception as exc:
            self.crash(exc)
        finally:
            if self.leave():
                self.outbox.close(self.upstream_error())

    async def _run_fast(self, counters: Any) -> None:
        aget, aput, op, clock = self.inbox.aget, self.outbox.aput, self.op, time.perf_counter
        while True:
            item = await aget()
            if item is EOF:
                return
            counters.num_in += 1
            t0 = clock()
            try:
                out = await op(item)
            except Exception as exc:
                counters.op_time += clock() - t0
                self.record_failure(item, exc)
                continue
            counters.op_time += clock() - t0
            if out is not None:
                await aput(out)
                counters.num_out += 1

    async def _run_general(self, counters: Any) -> None:
        aget, aput, clock = self.inbox.aget, self.outbox.aput, time.perf_counter
        if self.ordered and self._window is None:
            self._window = asyncio.Semaphore(self.window)
        window = self._window
        while True:
            if window is not None:
                await window.acquire()
            item = await aget()
            if item is EOF:
                if window is not None:
                    window.release()
                return
            seq = self._next_seq  # taken with no await in between: the loop is ours alone
            self._next_seq += 1
            counters.num_in += 1
            t0 = clock()
            outs: list[Any] = []
            try:
                if self.kind is OpKind.ASYNC_GEN:
                    async for out in self.op(item):
                        if out is None:
                            continue
                        if self.ordered:
                            outs.append(out)
                        else:
                            await aput(out)
                            counters.num_out += 1
                else:
                    out = await self.op(item)
                    if out is not None:
                        outs.append(out)
            except ChannelAborted:
                raise
            except Exception as exc:  # what a generator yielded before it raised is kept
                self.record_failure(item, exc)
            counters.op_time += clock() - t0
            if self.ordered:
                await self._emit_in_order(seq, outs, counters)

    async def _emit_in_order(self, seq: int, outs: list[Any], counters: Any) -> None:
        self._pending[seq] = outs
        if self._emitting:
            return  # the coroutine already emitting will reach this one
        self._emitting = True
        try:
            while self._next_emit in self._pending:
                for out in self._pending.pop(self._next_emit):
                    await self.outbox.aput(out)
                    counters.num_out += 1
                self._next_emit += 1
                assert self._window is not None
                self._window.release()
        finally:
            self._emitting = False
