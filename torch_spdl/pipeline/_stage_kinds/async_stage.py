"""A stage that runs an async op (coroutine or async generator) on the pipeline's loop.

``workers`` coroutines each loop: await an item, await the op, await the put. They never
leave the event loop, so an item moves between two async stages without a thread hop.

An autotuned stage starts ``max_workers`` coroutines (they cost no thread) and parks those
above the current limit on futures of the loop; :meth:`AsyncStage.set_concurrency` may be
called from any thread and wakes them through the loop.

A coroutine ends through the same end-of-stream template as a thread
(:meth:`~.node.Node.aend_worker`, the awaiting twin of ``end_worker``). An async stage
holds nothing to flush: ``aggregate`` always runs as a thread stage, whatever the ops
around it, so ``flush()`` is the base's empty one here; were it not, the template would
``aput`` what it returns, as a thread stage puts its partial batch.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from .._core.errors import describe_item
from .._declare.ops import OpKind
from .._plugins.hooks import hooked_async
from .._wire.channel import EOF, ChannelAborted
from .node import OpStage

if TYPE_CHECKING:
    from .._core.protocols import Supervisor

__all__ = ["AsyncStage"]


class AsyncStage(OpStage):
    """Async op on ``workers`` coroutines, in completion or input order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._emitting = False
        self._window: asyncio.Semaphore | None = None  # see ThreadStage._window
        self._parked: list[asyncio.Future[None]] = []
        self._released = False
        self._loop: asyncio.AbstractEventLoop | None = None

    starts_every_worker = True  # a parked coroutine costs no thread

    def launch(self, runtime: Supervisor) -> None:
        self.enter_stage_hooks()
        for i in range(self.workers):
            runtime.spawn_task(partial(self._work, i))

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

    def _call_failed(self, item: Any, exc: Exception) -> None:
        """Calling an async op raised before it could run (a wrong signature, say): every
        item would fail the same way, so the stage fails, as in SPDL."""
        exc.add_note(
            f"torch_spdl: calling the op of stage {self.name!r} on item {describe_item(item)} "
            "raised before it ran (does it take exactly one argument?)"
        )
        self.fail(exc)

    def unblock_workers(self) -> None:
        # Called on the loop's thread (every failure of an async stage is raised there).
        self._released = True
        self._wake_parked()
        if self._window is not None:
            for _ in range(self.workers):
                self._window.release()

    async def _gate(self, index: int) -> None:
        """Park coroutine ``index`` of an autotuned stage while it is above the limit."""
        while index >= self._concurrency and not self._released:
            fut = asyncio.get_running_loop().create_future()
            self._parked.append(fut)
            await fut

    async def _work(self, index: int) -> None:
        self._loop = asyncio.get_running_loop()
        counters = self.new_counters()
        op = self.op
        if self.hooks:
            op = hooked_async(op, self.hooks, generator=self.kind is OpKind.ASYNC_GEN)
        if self.tracer is not None:
            op = self.tracer.wrap_async(self, index, op, generator=self.kind is OpKind.ASYNC_GEN)
        try:
            if self.ordered or self.kind is OpKind.ASYNC_GEN:
                await self._run_general(counters, index, op)
            else:
                await self._run_fast(counters, index, op)
        except ChannelAborted:
            pass
        except Exception as exc:
            self.crash(exc)
        finally:
            await self.aend_worker()

    def release_parked(self) -> None:
        if self.tunable:
            self._released = True
            self._wake_parked()

    # The gate is checked inline, before each get: awaiting a helper that checks it would
    # make a coroutine object per item (about a microsecond each at 40,000 items a second).
    async def _run_fast(self, counters: Any, index: int, op: Any) -> None:
        aget, aput, clock = self.inbox.aget, self.outbox.aput, time.perf_counter
        gated = self.tunable
        while True:
            if gated and index >= self._concurrency:
                await self._gate(index)
            item = await aget()
            if item is EOF:
                return
            counters.num_in += 1
            t0 = clock()
            try:
                coro = op(item)
            except Exception as exc:  # the op cannot even be called: fail the stage
                self._call_failed(item, exc)
                return
            try:
                out = await coro
            except Exception as exc:
                counters.op_time += clock() - t0
                self.record_failure(item, exc)
                continue
            counters.op_time += clock() - t0
            if out is not None:
                await aput(out)
                counters.num_out += 1

    async def _run_general(self, counters: Any, index: int, op: Any) -> None:
        aget, aput, clock = self.inbox.aget, self.outbox.aput, time.perf_counter
        gated = self.tunable
        if self.ordered and self._window is None:
            self._window = asyncio.Semaphore(self.window)
        window, ordered, is_gen = self._window, self.ordered, self.kind is OpKind.ASYNC_GEN
        while True:
            if window is not None:
                await window.acquire()
            if gated and index >= self._concurrency:
                await self._gate(index)
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
                call = op(item)
            except Exception as exc:  # the op cannot even be called: fail the stage
                self._call_failed(item, exc)
                return
            try:
                if is_gen:
                    async for out in call:
                        if out is None:
                            continue
                        if ordered:
                            outs.append(out)
                        else:
                            await aput(out)
                            counters.num_out += 1
                else:
                    out = await call
                    if out is not None:
                        outs.append(out)
            except ChannelAborted:
                raise
            except Exception as exc:  # what a generator yielded before it raised is kept
                self.record_failure(item, exc)
            counters.op_time += clock() - t0
            if ordered:
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
