"""A stage that runs an async op (coroutine or async generator) on the pipeline's loop.

``workers`` coroutines each loop: await an item, await the op, await the put. They never
leave the event loop, so an item moves between two async stages without a thread hop.
In completion order one loop (:meth:`AsyncStage._run_fast`) serves a coroutine function
and an async generator alike, as the thread stage's does: a generator's outputs go
downstream as it makes them, from inside the call. In input order the outputs of each
item wait for their turn (:meth:`AsyncStage._run_ordered`).

An autotuned stage starts ``max_workers`` coroutines (they cost no thread) and parks those
above the current limit on futures of the loop; :meth:`AsyncStage.set_concurrency` may be
called from any thread and wakes them through the loop.

A coroutine ends through the same end-of-stream template as a thread (``node.py``). An
async stage holds nothing to flush: ``aggregate`` always runs as a thread stage, whatever
the ops around it, so ``flush()`` is the base's empty one here; were it not, the template
would ``aput`` what it returns, as a thread stage puts its partial batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._core.stats import Counters
from .._declare.ops import OpKind
from .._plugins.hooks import hooked_async
from .._wire.channel import EOF, ChannelAborted
from .op_stage import OpStage
from .pace import Pace

__all__ = ["AsyncStage"]

AsyncOp = Callable[[Any], Any]  # a coroutine function, or an async generator function


class AsyncStage(OpStage):
    """Async op on ``workers`` coroutines, in completion or input order."""

    on_loop = True
    starts_every_worker = True  # a parked coroutine costs no thread

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._emitting = False
        self._window: asyncio.Semaphore | None = None  # see ThreadStage._window
        self._parked: list[asyncio.Future[None]] = []
        self._released = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _resize(self, n: int) -> None:
        super()._resize(n)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._wake_parked)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _wake_parked(self) -> None:
        parked, self._parked = self._parked, []
        for fut in parked:
            if not fut.done():
                fut.set_result(None)

    def unblock_workers(self) -> None:
        # Called on the loop's thread (every failure of an async stage is raised there).
        self._released = True
        self._wake_parked()
        if self._window is not None:
            for _ in range(self.workers):
                self._window.release()

    def release_parked(self) -> None:
        if self.tunable:
            self._released = True
            self._wake_parked()

    async def _gate(self, index: int) -> None:
        """Park coroutine ``index`` of an autotuned stage while it is above the limit."""
        while index >= self.concurrency and not self._released:
            fut = asyncio.get_running_loop().create_future()
            self._parked.append(fut)
            await fut

    async def awork(self, index: int, counters: Counters) -> None:
        self._loop = asyncio.get_running_loop()
        op = self.op
        if self.hooks:
            op = hooked_async(op, self.hooks, generator=self.kind is OpKind.ASYNC_GEN)
        if self.tracer is not None:
            op = self.tracer.wrap_async(self, index, op, generator=self.kind is OpKind.ASYNC_GEN)
        if self.ordered:
            await self._run_ordered(counters, index, op)
        elif _bulk_ready(self):
            await _run_bulk(self, counters, op)
        else:
            await self._run_fast(counters, index, op)

    # The gate is checked inline, before each get: awaiting a helper that checks it would
    # make a coroutine object per item (about a microsecond each at 40,000 items a second).
    async def _run_fast(self, counters: Counters, index: int, op: AsyncOp) -> None:
        aget, aput, clock = self.inbox.aget, self.outbox.aput, time.perf_counter
        gated = self.tunable
        if self.kind is OpKind.ASYNC_GEN:
            op = _streamed(op, aput, counters)
        while True:
            if gated and index >= self.concurrency:
                await self._gate(index)
            item = await aget()
            if item is EOF:
                return
            counters.num_in += 1
            t0 = clock()
            try:
                out = await op(item)
            except ChannelAborted:
                raise
            except Exception as exc:
                counters.op_time += clock() - t0
                self.record_failure(item, exc)
                continue
            counters.op_time += clock() - t0
            if out is not None:
                await aput(out)
                counters.num_out += 1

    async def _run_ordered(self, counters: Counters, index: int, op: AsyncOp) -> None:
        aget, clock = self.inbox.aget, time.perf_counter
        gated = self.tunable
        if self._window is None:
            self._window = asyncio.Semaphore(self.window)
        window, is_gen = self._window, self.kind is OpKind.ASYNC_GEN
        while True:
            await window.acquire()
            if gated and index >= self.concurrency:
                await self._gate(index)
            item = await aget()
            if item is EOF:
                window.release()
                return
            seq = self._next_seq  # taken with no await in between: the loop is ours alone
            self._next_seq += 1
            counters.num_in += 1
            t0 = clock()
            outs: list[Any] = []
            try:
                if is_gen:
                    async for out in op(item):
                        if out is not None:
                            outs.append(out)
                else:
                    out = await op(item)
                    if out is not None:
                        outs.append(out)
            except ChannelAborted:
                raise
            except Exception as exc:  # what a generator yielded before it raised is kept
                self.record_failure(item, exc)
            counters.op_time += clock() - t0
            await self._emit_in_order(seq, outs, counters)

    async def _emit_in_order(self, seq: int, outs: list[Any], counters: Counters) -> None:
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


def _bulk_ready(node: AsyncStage) -> bool:
    """As a thread stage's (``thread_stage._bulk_ready``): a coroutine function that only
    the stage counts and times, between channels that move items in bulk."""
    return (
        node.kind is OpKind.ASYNC_FUNC
        and not node.hooks
        and node.tracer is None
        and not node.tunable
        and node.inbox.bulk
        and node.outbox.bulk
    )


async def _run_bulk(node: AsyncStage, counters: Counters, op: AsyncOp) -> None:
    """The thread stage's bulk loop as a coroutine: a paced take of ready items, the op
    awaited on each, the outputs staged and flushed at the end of the take, at once when
    a reader waits (the channel's notes). While the pace is one item (an op slower than
    half of ``TAKE_S``) an item moves as in the one-item loop (``aget``, ``aput``): the
    32 coroutines of a stage that waits 10 ms wake together, and the loop's bookkeeping
    for each delays the next one's wait (bulk bookkeeping there cost 0.9% of its rate)."""
    inbox, outbox, clock = node.inbox, node.outbox, time.perf_counter
    aget_many, aflush, waiting = inbox.aget_many, outbox.aflush, outbox.has_readers_waiting
    segment = outbox.staging()
    stage, pace, room = segment.append, Pace(), outbox.room
    while True:
        if pace.limit == 1:
            if not await _one(node, counters, op, pace):
                return
            continue
        items = await aget_many(min(pace.limit, room()))
        if items is EOF:
            return
        t0 = clock()
        for item in items:
            counters.num_in += 1
            try:
                out = await op(item)
            except ChannelAborted:
                raise
            except Exception as exc:
                node.record_failure(item, exc)
                if node._failure is not None:
                    break
                continue
            if out is not None:
                stage(out)
                counters.num_out += 1
                if waiting():
                    await aflush(segment)
        elapsed = clock() - t0
        counters.op_time += elapsed
        await aflush(segment)
        pace.update(elapsed, len(items))


async def _one(node: AsyncStage, counters: Counters, op: AsyncOp, pace: Pace) -> bool:
    """One item through ``op``, unstaged (False at the end of the stream)."""
    item = await node.inbox.aget()
    if item is EOF:
        return False
    counters.num_in += 1
    t0 = time.perf_counter()
    try:
        out = await op(item)
    except ChannelAborted:
        raise
    except Exception as exc:  # recorded here: a name kept past the block would hold the
        node.record_failure(item, exc)  # exception, its traceback and this frame in a cycle
        out = None
    elapsed = time.perf_counter() - t0  # a failure's recording counted, as in a take
    counters.op_time += elapsed
    pace.update(elapsed, 1)
    if out is not None:
        await node.outbox.aput(out)
        counters.num_out += 1
    return True


def _streamed(
    op: AsyncOp, aput: Callable[[Any], Awaitable[None]], counters: Counters
) -> Callable[[Any], Awaitable[None]]:
    """An async generator op as a coroutine function that puts each output as it is made."""

    async def streamed(item: Any) -> None:
        async for out in op(item):
            if out is not None:
                await aput(out)
                counters.num_out += 1

    return streamed
