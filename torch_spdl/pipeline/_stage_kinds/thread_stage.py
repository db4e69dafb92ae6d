"""A stage that runs a sync op (function or generator) on long-lived worker threads.

Each worker loops: take an item, run the op, put the result. There is no per-item task,
future or executor dispatch on the default path, which is what makes the hot path cheap.
That loop (:meth:`ThreadStage._run_fast`) serves a function and a generator alike: a
generator's outputs go downstream as it makes them, from inside the call. With a user
executor (a dedicated ``ThreadPoolExecutor``, a ``ProcessPoolExecutor``), or in input
order, the general loop runs instead: each worker hands its item to the executor and
waits, so the executor does the work while ``concurrency`` bounds how many items are in
flight, and the outputs wait for their turn.

With a ``ProcessPoolExecutor`` a round trip costs hundreds of microseconds and a pickle each
way, more than a small op itself: a worker then sends the items already waiting in its input
queue together, as one task (the process wire's ``call_each``), as many as make a task of
about :data:`CHUNK_S` by the time measured so far (at most :data:`MAX_CHUNK`), and the
results come back as one message (``Outcomes``). A slow op gets chunks of one item, as
before; a failing item fails alone. (Not with hooks, tracing or ``concurrency="auto"``,
which count items one by one.)

An autotuned stage (``concurrency="auto"``) starts its workers lazily, as the autotuner
raises the limit, and parks the workers above the limit on a condition variable (no
polling); only those stages pay for the check, once per item. Tracing wraps the op once per
worker, so a stage that is not traced runs exactly the loop it runs without tracing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, ProcessPoolExecutor
from functools import partial
from typing import Any

from ..._procwire import Outcomes, call_each
from .._core.stats import Counters
from .._declare.ops import OpKind, call_to_list
from .._plugins.hooks import hooked_sync
from .._wire.channel import EMPTY, EOF, ChannelAborted
from .node import start_worker
from .op_stage import OpStage
from .pace import Pace

__all__ = ["CHUNK_S", "MAX_CHUNK", "ThreadStage"]

CHUNK_S = 0.002  # a process-pool task of at least this long makes its round trip cheap
MAX_CHUNK = 32


class ThreadStage(OpStage):
    """Sync op on ``workers`` threads, in completion or input order."""

    def __init__(self, *args: Any, executor: Executor | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.executor = executor
        self._take_lock = threading.Lock()
        self._emit_lock = threading.Lock()
        # In input order, at most `window` items are taken and not yet emitted, so a slow
        # head item cannot make the stage pull (and hold) the rest of the stream.
        self._window = threading.Semaphore(self.window)
        self._parking = threading.Condition()  # autotuned stages: workers above the limit
        self._released = False  # end of input or stop: parked workers leave

    one_task_per_item = False  # with hooks: a generator op's call is one task, not each step

    def _resize(self, n: int) -> None:
        with self._parking:
            super()._resize(n)
            while self.started_workers < n and not self._released and start_worker(self):
                pass
            self._parking.notify_all()

    def release_parked(self) -> None:
        if self.tunable:
            with self._parking:
                self._released = True
                self._parking.notify_all()

    def on_stop(self) -> None:
        self.unblock_workers()

    def unblock_workers(self) -> None:
        with self._parking:
            self._released = True
            self._parking.notify_all()
        for _ in range(self.started_workers):  # free workers waiting for the window
            self._window.release()

    def work(self, index: int, counters: Counters) -> None:
        if self.executor is not None or self.ordered:
            if (
                isinstance(self.executor, ProcessPoolExecutor)
                and self.kind is OpKind.FUNC
                and not self.hooks
                and self.tracer is None
                and not self.tunable
            ):
                self._loop_chunked(counters)
                return
            compute, close = self._compute_fn()
            try:
                self._loop_general(counters, index, compute)
            finally:
                if close is not None:
                    close()
            return
        op, close = self.op, None
        if self.hooks:
            op, close = self._hooked(op)
        if self.tracer is not None:
            op = self.tracer.wrap(self, index, op, generator=self.kind is OpKind.GEN)
        try:
            if _bulk_ready(self):
                _run_bulk(self, counters, op)
            else:
                self._run_fast(counters, index, op)
        finally:
            if close is not None:
                close()

    def _hooked(self, op: Callable[[Any], Any]) -> tuple[Callable[[Any], Any], Callable[[], None]]:
        """``op`` with this stage's task hooks (one private event loop per worker)."""
        if self.kind is OpKind.GEN and self.one_task_per_item:
            hooked, close = hooked_sync(lambda item: list(op(item)), self.hooks, generator=False)
            return (lambda item: hooked(item) or ()), close
        return hooked_sync(op, self.hooks, generator=self.kind is OpKind.GEN)

    # The hot path: completion order, on our own thread. A generator's outputs are put from
    # inside the call (_streamed), so one loop serves both kinds.
    def _run_fast(self, counters: Counters, index: int, op: Callable[[Any], Any]) -> None:
        put, clock = self.outbox.put, time.perf_counter
        get = _gated(self, index) if self.tunable else self.inbox.get
        if self.kind is OpKind.GEN:
            op = _streamed(op, put, counters)
        while True:
            item = get()
            if item is EOF:
                return
            counters.num_in += 1
            t0 = clock()
            try:
                out = op(item)
            except ChannelAborted:
                raise
            except Exception as exc:
                counters.op_time += clock() - t0
                self.record_failure(item, exc)
                continue
            counters.op_time += clock() - t0
            if out is not None:
                put(out)
                counters.num_out += 1

    # Everything else: an executor, or input order, or both.
    def _loop_general(
        self, counters: Counters, index: int, compute: Callable[[Any, list[Any]], None]
    ) -> None:
        get, clock, ordered = self.inbox.get, time.perf_counter, self.ordered
        if self.tracer is not None:
            compute = self.tracer.wrap(self, index, compute, generator=False)
        gate = partial(self._gate, index) if self.tunable else None
        while True:
            if gate is not None:
                gate()
            if ordered:
                self._window.acquire()
                with self._take_lock:
                    item = get()
                    if item is EOF:
                        self._window.release()
                        return
                    seq = self._next_seq
                    self._next_seq += 1
            else:
                item = get()
                if item is EOF:
                    return
            counters.num_in += 1
            t0 = clock()
            outs: list[Any] = []
            try:
                compute(item, outs)
            except BrokenExecutor as exc:
                self._executor_broken(exc)
                return
            except Exception as exc:  # what a generator yielded before it raised is kept
                self.record_failure(item, exc)
            counters.op_time += clock() - t0
            self._emit(seq if ordered else None, outs, counters)

    def _loop_chunked(self, counters: Any) -> None:
        """The general loop, a chunk of waiting items per process-pool task."""
        get, clock = self.inbox.get, time.perf_counter
        executor, op, ordered = self.executor, self.op, self.ordered
        assert executor is not None
        per_item: float | None = None  # seconds per item, round trip included (averaged)
        while True:
            limit = 1 if per_item is None else int(CHUNK_S / max(per_item, 1e-9))
            limit = max(1, min(MAX_CHUNK, limit))
            if ordered:
                self._window.acquire()
                with self._take_lock:
                    items = self._take_chunk(get, limit)
                    if not items:
                        self._window.release()
                        return
                    seq = self._next_seq
                    self._next_seq += 1
            else:
                items = self._take_chunk(get, limit)
                if not items:
                    return
            counters.num_in += len(items)
            t0 = clock()
            try:
                results = executor.submit(call_each, op, items).result()
            except BrokenExecutor as exc:
                self._executor_broken(exc)
                return
            except Exception as exc:  # the chunk did not cross (an item that does not pickle)
                results = Outcomes.not_sent(items, exc)
            elapsed = clock() - t0
            counters.op_time += elapsed
            now = elapsed / len(items)
            per_item = now if per_item is None else 0.8 * per_item + 0.2 * now
            for i, error in results.errors.items():
                self.record_failure(items[i], error)
            outs = [value for value in results.values if value is not None]
            self._emit(seq if ordered else None, outs, counters)

    def _take_chunk(self, get: Callable[[], Any], limit: int) -> list[Any]:
        """The next item (waiting for it) and up to ``limit - 1`` more that are there."""
        first = get()
        if first is EOF:
            return []
        items = [first]
        get_nowait = self.inbox.get_nowait
        while len(items) < limit:
            item = get_nowait()
            if item is EOF or item is EMPTY:
                break
            items.append(item)
        return items

    def _compute_fn(self) -> tuple[Callable[[Any, list[Any]], None], Callable[[], None] | None]:
        """A function that appends the op's outputs for an item to a list, and the closer of
        the hooks' event loop (None without hooks)."""
        op, executor, close = self.op, self.executor, None
        if executor is None:
            if self.hooks:
                op, close = self._hooked(op)
            if self.kind is OpKind.GEN:
                return (lambda item, outs: outs.extend(o for o in op(item) if o is not None)), close
            return (lambda item, outs: _append(outs, op(item))), close
        if self.kind is OpKind.GEN:
            # A generator cannot cross a process boundary: run it to the end in the executor.
            task = partial(call_to_list, op)

            def submit_gen(item: Any) -> Any:
                return executor.submit(task, item).result()

            run: Callable[[Any], Any] = submit_gen
            if self.hooks:  # the whole call is one task
                run, close = hooked_sync(submit_gen, self.hooks, generator=False)
            return (
                lambda item, outs: outs.extend(o for o in run(item) or () if o is not None)
            ), close

        def submit(item: Any) -> Any:
            return executor.submit(op, item).result()

        call: Callable[[Any], Any] = submit
        if self.hooks:
            call, close = hooked_sync(submit, self.hooks, generator=False)
        return (lambda item, outs: _append(outs, call(item))), close

    def _emit(self, seq: int | None, outs: list[Any], counters: Counters) -> None:
        """Put an item's outputs: at once, or in input order (``seq``: its place)."""
        if seq is None:
            for out in outs:
                self.outbox.put(out)
                counters.num_out += 1
            return
        with self._emit_lock:
            self._pending[seq] = outs
            while self._next_emit in self._pending:
                for out in self._pending.pop(self._next_emit):
                    self.outbox.put(out)
                    counters.num_out += 1
                self._next_emit += 1
                self._window.release()

    def _gate(self, index: int) -> None:
        """Park worker ``index`` of an autotuned stage while it is above the limit."""
        if index >= self.concurrency:
            with self._parking:
                while index >= self.concurrency and not self._released:
                    self._parking.wait()

    def _executor_broken(self, exc: BaseException) -> None:
        exc.add_note(
            f"torch_spdl: stage {self.name!r}: its executor {self.executor!r} is broken "
            "(a worker process died?)"
        )
        self.fail(exc)


def _bulk_ready(node: ThreadStage) -> bool:
    """Whether items may cross in bulk: a plain function, counted and timed by the
    stage alone (no hooks, tracer or autotuner meter, which see items one by one),
    between channels that take and stage in bulk."""
    return (
        node.kind is OpKind.FUNC
        and not node.hooks
        and node.tracer is None
        and not node.tunable
        and node.inbox.bulk
        and node.outbox.bulk
    )


# The hot path for a function: a take of ready items (paced, pace.py), the op over
# them in one loop, the outputs staged and flushed under one lock (channel notes). While
# the pace is one item (a slow op) an item moves unstaged, with one get and one put:
# staging it would cost two flushes and a look for readers, and gain nothing.
def _run_bulk(node: ThreadStage, counters: Counters, op: Callable[[Any], Any]) -> None:
    inbox, outbox, clock = node.inbox, node.outbox, time.perf_counter
    get_many, flush, waiting = inbox.get_many, outbox.flush, outbox.has_readers_waiting
    segment = outbox.staging()
    stage, pace = segment.append, Pace()
    room = outbox.room  # a take never holds more than the outbox has room for
    while True:
        if pace.limit == 1:
            if not _one(node, counters, op, pace):
                return
            continue
        items = get_many(min(pace.limit, room()))
        if items is EOF:
            return
        t0 = clock()
        for item in items:  # counted item by item: get_stats() is live inside a take
            counters.num_in += 1
            try:
                out = op(item)
            except ChannelAborted:
                raise
            except Exception as exc:
                node.record_failure(item, exc)
                if node._failure is not None:
                    break  # over budget: the rest of the take goes as the inbox did
                continue
            if out is not None:
                stage(out)
                counters.num_out += 1
                if waiting():  # a reader waits: never make it wait for the take
                    flush(segment)
        elapsed = clock() - t0
        counters.op_time += elapsed
        flush(segment)
        pace.update(elapsed, len(items))


def _one(node: ThreadStage, counters: Counters, op: Callable[[Any], Any], pace: Pace) -> bool:
    """One item through ``op``, unstaged (False at the end of the stream)."""
    item = node.inbox.get()
    if item is EOF:
        return False
    counters.num_in += 1
    t0 = time.perf_counter()
    try:
        out = op(item)
    except ChannelAborted:
        raise
    except Exception as exc:  # recorded here: a name kept past the block would hold the
        node.record_failure(item, exc)  # exception, its traceback and this frame in a cycle
        out = None
    elapsed = time.perf_counter() - t0  # a failure's recording counted, as in a take
    counters.op_time += elapsed
    pace.update(elapsed, 1)
    if out is not None:
        node.outbox.put(out)
        counters.num_out += 1
    return True


def _gated(stage: ThreadStage, index: int) -> Callable[[], Any]:
    """``inbox.get`` for worker ``index`` of an autotuned stage: park while above the limit
    (checked inline: no call per item while not parking)."""
    take, gate = stage.inbox.get, stage._gate

    def get() -> Any:
        if index >= stage.concurrency:
            gate(index)
        return take()

    return get


def _streamed(
    op: Callable[[Any], Any], put: Callable[[Any], None], counters: Counters
) -> Callable[[Any], None]:
    """A generator op as a function that puts each output as it is made (returns None)."""

    def streamed(item: Any) -> None:
        for out in op(item):
            if out is not None:
                put(out)
                counters.num_out += 1

    return streamed


def _append(outs: list[Any], out: Any) -> None:
    if out is not None:
        outs.append(out)
