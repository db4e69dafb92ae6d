"""The public API of ``torch_spdl.pipeline``: op kinds, ordering, concurrency, sources, sinks,
timeouts, stats, and bounded memory.

No test uses ``time.sleep`` to synchronise: threads meet on Events, Conditions and Barriers,
each with a timeout so a broken engine fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import multiprocessing as mp
import os
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from _sync import WAIT, Gate

from torch_spdl.pipeline import Pipeline, PipelineBuilder, StageStats

pytestmark = pytest.mark.timeout(600)


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
class InFlight:
    """Counts simultaneous calls of an op (and the threads they ran on)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = 0
        self.peak = 0
        self.threads: set[int] = set()

    def enter(self) -> None:
        with self.cond:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.threads.add(threading.get_ident())
            self.cond.notify_all()

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def wait_until(self, predicate, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: predicate(self), timeout)


class CountingSource:
    """An infinite source that counts how many items were pulled out of it."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pulled = 0

    def __iter__(self):
        for i in itertools.count():
            with self.cond:
                self.pulled += 1
                self.cond.notify_all()
            yield i

    def wait_until(self, predicate, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: predicate(self.pulled), timeout)


def stage_stats(pipeline: Pipeline, fragment: str) -> StageStats:
    matches = [s for s in pipeline.get_stats() if fragment in s.name]
    assert len(matches) == 1, [s.name for s in pipeline.get_stats()]
    return matches[0]


# Module-level so that a ProcessPoolExecutor (spawn) can pickle them by reference.
def _square_in_process(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _plus_minus_in_process(x: int):
    yield x
    yield -x


# ---------------------------------------------------------------------------------------
# op kinds
# ---------------------------------------------------------------------------------------
def _double(x):
    return 2 * x


async def _adouble(x):
    await asyncio.sleep(0)
    return 2 * x


def _spread(x):
    for i in range(x % 3):
        yield (x, i)


async def _aspread(x):
    for i in range(x % 3):
        await asyncio.sleep(0)
        yield (x, i)


def _add(x, *, k):
    return x + k


async def _aadd(x, *, k):
    await asyncio.sleep(0)
    return x + k


class _Offset:
    """A callable object; its state (the offset) travels with it."""

    def __init__(self, offset):
        self.offset = offset

    def __call__(self, x):
        return x + self.offset


class _AsyncOffset:
    def __init__(self, offset):
        self.offset = offset

    async def __call__(self, x):
        await asyncio.sleep(0)
        return x + self.offset


N = 30
_SPREAD = [(x, i) for x in range(N) for i in range(x % 3)]

OP_CASES = {
    "sync function": (_double, [2 * x for x in range(N)]),
    "lambda": (lambda x: x - 1, [x - 1 for x in range(N)]),
    "async function": (_adouble, [2 * x for x in range(N)]),
    "sync generator": (_spread, _SPREAD),
    "async generator": (_aspread, _SPREAD),
    "callable object": (_Offset(100), [x + 100 for x in range(N)]),
    "async callable object": (_AsyncOffset(7), [x + 7 for x in range(N)]),
    "partial": (functools.partial(_add, k=5), [x + 5 for x in range(N)]),
    "partial of async": (functools.partial(_aadd, k=3), [x + 3 for x in range(N)]),
    "dict": ({x: f"v{x}" for x in range(N)}, [f"v{x}" for x in range(N)]),
    "list": ([x * x for x in range(N)], [x * x for x in range(N)]),
}


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("case", list(OP_CASES))
def test_op_kinds(case, concurrency):
    op, expected = OP_CASES[case]
    pipeline = (
        PipelineBuilder().add_source(range(N)).pipe(op, concurrency=concurrency).add_sink(3).build()
    )
    out = list(pipeline)
    if concurrency == 1:  # a single worker keeps the order
        assert out == expected
    else:
        assert sorted(out) == sorted(expected)


def test_stateful_callable_object_sees_every_item():
    class Tally:
        def __init__(self):
            self.seen = []

        def __call__(self, x):
            self.seen.append(x)
            return len(self.seen)

    tally = Tally()
    out = list(PipelineBuilder().add_source("abcde").pipe(tally).add_sink(1).build())
    assert out == [1, 2, 3, 4, 5]
    assert tally.seen == list("abcde")


def test_generator_op_yields_several_outputs_per_input_in_input_order():
    def explode(x):
        yield from range(x)

    out = list(
        PipelineBuilder()
        .add_source([3, 0, 2])
        .pipe(explode, concurrency=2, output_order="input")
        .add_sink(1)
        .build()
    )
    assert out == [0, 1, 2, 0, 1]


def test_container_op_missing_key_drops_the_item():
    table = {0: "zero", 2: "two"}
    pipeline = PipelineBuilder().add_source(range(4)).pipe(table).add_sink(2).build()
    assert list(pipeline) == ["zero", "two"]
    assert stage_stats(pipeline, "1:").num_failed == 2


# ---------------------------------------------------------------------------------------
# None results are dropped
# ---------------------------------------------------------------------------------------
def _evens_only(x):
    return x if x % 2 == 0 else None


async def _aevens_only(x):
    return x if x % 2 == 0 else None


def _gen_evens_only(x):
    yield None
    yield x if x % 2 == 0 else None


async def _agen_evens_only(x):
    yield None
    yield x if x % 2 == 0 else None


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (_evens_only, [2, 4, 6, 8, 10]),
        (_aevens_only, [2, 4, 6, 8, 10]),
        (_gen_evens_only, [2, 4, 6, 8, 10]),
        (_agen_evens_only, [2, 4, 6, 8, 10]),
        ({x: (x if x % 5 == 0 else None) for x in range(1, 11)}, [5, 10]),  # None values
    ],
    ids=["function", "async function", "generator", "async generator", "dict"],
)
@pytest.mark.parametrize("output_order", ["completion", "input"])
def test_none_results_are_dropped(op, expected, output_order):
    pipeline = (
        PipelineBuilder()
        .add_source(range(1, 11))
        .pipe(op, concurrency=2, output_order=output_order)
        .add_sink(2)
        .build()
    )
    out = list(pipeline)
    assert sorted(out) == expected
    if output_order == "input":
        assert out == expected
    assert stage_stats(pipeline, "1:").num_failed == 0


# ---------------------------------------------------------------------------------------
# aggregate / disaggregate
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "size", "drop_last", "expected"),
    [
        (10, 3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
        (10, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
        (9, 3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),  # no empty batch at the end
        (2, 5, False, [[0, 1]]),
        (2, 5, True, []),
        (0, 5, False, []),
        (3, 1, False, [[0], [1], [2]]),
    ],
)
def test_aggregate(n, size, drop_last, expected):
    pipeline = (
        PipelineBuilder().add_source(range(n)).aggregate(size, drop_last=drop_last).add_sink(2)
    ).build()
    assert list(pipeline) == expected


def test_disaggregate_round_trip_and_empty_lists():
    out = list(
        PipelineBuilder()
        .add_source(range(10))
        .aggregate(4)
        .pipe(lambda batch: [x * 10 for x in batch])
        .disaggregate()
        .add_sink(2)
        .build()
    )
    assert out == [x * 10 for x in range(10)]

    out = list(PipelineBuilder().add_source([[1, 2], [], (3,), [4]]).disaggregate().build())
    assert out == [1, 2, 3, 4]


def test_aggregate_after_dropping_stage_counts_only_kept_items():
    out = list(
        PipelineBuilder().add_source(range(10)).pipe(_evens_only).aggregate(2).add_sink(1).build()
    )
    assert out == [[0, 2], [4, 6], [8]]


# ---------------------------------------------------------------------------------------
# output_order="input" with items that finish out of order
# ---------------------------------------------------------------------------------------
ORDER_KINDS = ["sync", "sync generator", "thread executor", "async", "async generator"]


@pytest.mark.parametrize("kind", ORDER_KINDS)
def test_input_order_is_kept_when_items_finish_out_of_order(kind):
    """Item 0 cannot finish before the last item has finished (it waits on a gate that the
    last item opens), yet the output comes in input order. In input order a stage takes at
    most 2 * concurrency items ahead of the oldest unfinished one, so n stays within that."""
    n, conc = 6, 3
    gate = Gate()
    finished: list[int] = []
    lock = threading.Lock()

    def finish(x):
        with lock:
            finished.append(x)

    def sync_op(x):
        if x == 0:
            assert gate.wait(), "the last item was never processed while item 0 waited"
        finish(x)
        if x == n - 1:
            gate.set()
        return x * 10

    def sync_gen(x):
        yield sync_op(x)
        yield x * 10 + 1

    async def async_op(x):
        if x == 0:
            assert await gate.await_(), "the last item was never processed while item 0 waited"
        finish(x)
        if x == n - 1:
            gate.set()
        return x * 10

    async def async_gen(x):
        yield await async_op(x)
        await asyncio.sleep(0)
        yield x * 10 + 1

    executor = None
    if kind == "sync":
        op = sync_op
    elif kind == "sync generator":
        op = sync_gen
    elif kind == "thread executor":
        op, executor = sync_op, ThreadPoolExecutor(max_workers=conc)
    elif kind == "async":
        op = async_op
    else:
        op = async_gen
    try:
        pipeline = (
            PipelineBuilder()
            .add_source(range(n))
            .pipe(op, concurrency=conc, executor=executor, output_order="input")
            .add_sink(2)
            .build()
        )
        out = list(pipeline)
    finally:
        gate.set()
        if executor is not None:
            executor.shutdown()
    assert finished.index(n - 1) < finished.index(0), finished  # really out of order
    if kind.endswith("generator"):
        assert out == [v for x in range(n) for v in (x * 10, x * 10 + 1)]
    else:
        assert out == [x * 10 for x in range(n)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_completion_order_emits_as_finished(kind):
    """Control for the test above: in completion order, a slow item comes out last."""
    n = 6
    gate = Gate()

    def sync_op(x):
        if x == 0:
            assert gate.wait()
        return x

    async def async_op(x):
        if x == 0:
            assert await gate.await_()
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(sync_op if kind == "sync" else async_op, concurrency=2)
        .add_sink(n)
        .build()
    )
    out = []
    try:
        for x in pipeline:
            out.append(x)
            if len(out) == n - 1:
                gate.set()  # item 0 may finish only once all the others arrived
    finally:
        gate.set()
    assert out[-1] == 0
    assert sorted(out) == list(range(n))


# ---------------------------------------------------------------------------------------
# concurrency, num_threads, executors
# ---------------------------------------------------------------------------------------
def _tracked_ops(tracker: InFlight, gate: Gate):
    def sync_op(x):
        tracker.enter()
        try:
            assert gate.wait()
            return x
        finally:
            tracker.leave()

    def sync_gen(x):
        yield sync_op(x)

    async def async_op(x):
        tracker.enter()
        try:
            assert await gate.await_()
            return x
        finally:
            tracker.leave()

    async def async_gen(x):
        yield await async_op(x)

    return {"sync": sync_op, "sync generator": sync_gen, "async": async_op, "async gen": async_gen}


@pytest.mark.parametrize(
    "kind", ["sync", "sync generator", "async", "async gen", "thread executor(8)"]
)
@pytest.mark.parametrize("output_order", ["completion", "input"])
def test_concurrency_bounds_in_flight_calls(kind, output_order):
    conc, n = 3, 20
    tracker, gate = InFlight(), Gate()
    ops = _tracked_ops(tracker, gate)
    executor = ThreadPoolExecutor(max_workers=8) if kind.startswith("thread") else None
    op = ops["sync"] if executor else ops[kind]
    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(op, concurrency=conc, executor=executor, output_order=output_order)
        .add_sink(2)
        .build()
    )
    try:
        with pipeline.auto_stop():
            try:
                # saturated: `conc` calls are inside the op at once ...
                assert tracker.wait_until(lambda t: t.active == conc, WAIT), tracker.active
                # ... and no more join them while they all block
                assert not tracker.wait_until(lambda t: t.active > conc, 0.2), tracker.active
            finally:
                gate.set()
            out = list(pipeline)
    finally:
        gate.set()
        if executor is not None:
            executor.shutdown()
    assert sorted(out) == list(range(n))
    assert tracker.peak == conc


def test_num_threads_caps_sync_stage_threads():
    tracker, gate = InFlight(), Gate()
    op = _tracked_ops(tracker, gate)["sync"]
    pipeline = PipelineBuilder().add_source(range(20)).pipe(op, concurrency=8).build(num_threads=2)
    try:
        with pipeline.auto_stop():
            try:
                assert tracker.wait_until(lambda t: t.active == 2, WAIT)
                assert not tracker.wait_until(lambda t: t.active > 2, 0.2), tracker.active
            finally:
                gate.set()
            out = list(pipeline)
    finally:
        gate.set()
    assert sorted(out) == list(range(20))
    assert tracker.peak == 2
    assert len(tracker.threads) == 2
    assert threading.get_ident() not in tracker.threads


def test_num_threads_does_not_cap_async_stage():
    tracker, gate = InFlight(), Gate()
    op = _tracked_ops(tracker, gate)["async"]
    pipeline = PipelineBuilder().add_source(range(8)).pipe(op, concurrency=4).build(num_threads=1)
    try:
        with pipeline.auto_stop():
            try:
                assert tracker.wait_until(lambda t: t.active == 4, WAIT), tracker.active
            finally:
                gate.set()
            assert sorted(pipeline) == list(range(8))
    finally:
        gate.set()
    assert tracker.peak == 4


@pytest.mark.parametrize("output_order", ["completion", "input"])
def test_dedicated_single_thread_executor_runs_every_call_on_one_thread(output_order):
    names: list[str] = []
    idents: set[int] = set()

    def op(x):
        names.append(threading.current_thread().name)
        idents.add(threading.get_ident())
        return -x

    def gen_op(x):
        yield op(x)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dedicated") as executor:
        pipeline = (
            PipelineBuilder()
            .add_source(range(20))
            .pipe(op, concurrency=4, executor=executor, output_order=output_order)
            .pipe(gen_op, concurrency=2, executor=executor, output_order=output_order)
            .add_sink(2)
            .build()
        )
        out = list(pipeline)
    assert sorted(out) == list(range(20))
    if output_order == "input":
        assert out == list(range(20))
    assert len(names) == 40
    assert len(idents) == 1
    assert all(name.startswith("dedicated") for name in names), set(names)


def test_process_pool_executor_stage():
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as executor:
        pipeline = (
            PipelineBuilder()
            .add_source(range(12))
            .pipe(_square_in_process, concurrency=2, executor=executor, output_order="input")
            .add_sink(4)
            .build()
        )
        out = list(pipeline)
    assert [square for square, _ in out] == [x * x for x in range(12)]
    assert os.getpid() not in {pid for _, pid in out}


def test_process_pool_generator_op_on_plain_items():
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as executor:
        out = list(
            PipelineBuilder()
            .add_source(range(5))
            .pipe(_plus_minus_in_process, executor=executor)
            .build()
        )
    assert out == [0, 0, 1, -1, 2, -2, 3, -3, 4, -4]


def test_async_op_rejects_an_executor():
    with ThreadPoolExecutor(max_workers=1) as executor, pytest.raises(ValueError, match="async"):
        PipelineBuilder().add_source(range(3)).pipe(_adouble, executor=executor)


def test_to_thread_in_an_async_op_runs_on_threads_the_pipeline_joins():
    """``asyncio.to_thread`` (what torch_spdl.io's async functions use) runs on the loop's
    default executor: the pipeline's own, whose threads are gone once it stops."""
    names = []

    def work(x: int) -> int:
        names.append(threading.current_thread().name)
        return x

    async def op(x: int) -> int:
        return await asyncio.to_thread(work, x)

    pipeline = PipelineBuilder().add_source(range(8)).pipe(op, concurrency=4).add_sink(2).build()
    with pipeline.auto_stop():
        assert sorted(pipeline) == list(range(8))
    assert len(names) == 8
    assert all(name.startswith("torch_spdl_async") for name in names), names
    assert not [t.name for t in threading.enumerate() if t.name.startswith("torch_spdl_async")]


# ---------------------------------------------------------------------------------------
# builds, sources
# ---------------------------------------------------------------------------------------
def test_building_twice_gives_two_independent_full_runs():
    builder = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(lambda x: x + 1, concurrency=2)
        .aggregate(4)
        .add_sink(2)
    )
    p1, p2 = builder.build(), builder.build()
    assert p1 is not p2
    got1, got2 = [], []
    with p1.auto_stop(), p2.auto_stop():
        for _ in range(2):  # interleave the two consumers
            got1.append(p1.get_item(timeout=WAIT))
            got2.append(p2.get_item(timeout=WAIT))
        p1.stop()  # stopping one leaves the other running
        got2.extend(p2)
    expected = list(range(1, 21))
    assert sorted(itertools.chain(*got2)) == expected
    assert len(list(itertools.chain(*got1))) == 8
    assert stage_stats(p2, "source").num_out == 20
    # a third build after both ran is again a complete, fresh run
    p3 = builder.build()
    assert sorted(itertools.chain(*p3)) == expected
    assert stage_stats(p3, "aggregate").num_out == 5


def test_pipeline_as_source_of_another():
    inner = (
        PipelineBuilder()
        .add_source(range(15))
        .pipe(_double, concurrency=2)
        .pipe(_adouble, concurrency=2)
        .add_sink(2)
        .build()
    )
    outer = (
        PipelineBuilder()
        .add_source(inner)
        .pipe(lambda x: x + 1, concurrency=2)
        .aggregate(5)
        .add_sink(2)
        .build()
    )
    out = list(outer)
    assert sorted(itertools.chain(*out)) == [4 * x + 1 for x in range(15)]
    assert [len(b) for b in out] == [5, 5, 5]


@pytest.mark.parametrize("stage", ["sync", "async"])
def test_async_source(stage):
    async def numbers():
        for i in range(10):
            await asyncio.sleep(0)
            yield i

    class AsyncOnly:  # an async iterable that is not an async generator
        def __aiter__(self):
            return numbers()

    for source in (numbers(), AsyncOnly()):
        op = _double if stage == "sync" else _adouble
        pipeline = PipelineBuilder().add_source(source).pipe(op).add_sink(2).build()
        assert list(pipeline) == [2 * i for i in range(10)]
        assert stage_stats(pipeline, "source").num_out == 10


def test_source_must_be_iterable():
    with pytest.raises(TypeError):
        PipelineBuilder().add_source(42)


# ---------------------------------------------------------------------------------------
# get_item, timeouts
# ---------------------------------------------------------------------------------------
def test_get_item_returns_items_then_eof():
    pipeline = PipelineBuilder().add_source(range(4)).pipe(_double).add_sink(2).build()
    try:
        assert [pipeline.get_item(timeout=WAIT) for _ in range(4)] == [0, 2, 4, 6]
        with pytest.raises(EOFError):
            pipeline.get_item(timeout=WAIT)
        with pytest.raises(EOFError):  # and it stays at the end
            pipeline.get_item(timeout=WAIT)
    finally:
        pipeline.stop()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_get_iterator_timeout(kind):
    gate = Gate()

    pipeline = PipelineBuilder().add_source(range(3)).pipe(gate.gated_op(kind)).add_sink(2).build()
    try:
        with pipeline.auto_stop():
            iterator = pipeline.get_iterator(timeout=0.2)
            with pytest.raises(TimeoutError):  # nothing can arrive while the gate is shut
                next(iterator)
            gate.set()
    finally:
        gate.set()


def test_get_item_timeout_then_recovers():
    gate = Gate()

    def blocked(x):
        assert gate.wait(30)
        return x

    pipeline = PipelineBuilder().add_source(range(3)).pipe(blocked).add_sink(2).build()
    try:
        with pipeline.auto_stop():
            with pytest.raises(TimeoutError):  # nothing can arrive while the gate is shut
                pipeline.get_item(timeout=0.2)
            gate.set()
            assert [pipeline.get_item(timeout=WAIT) for _ in range(3)] == [0, 1, 2]
            with pytest.raises(EOFError):
                pipeline.get_item(timeout=WAIT)
    finally:
        gate.set()


# ---------------------------------------------------------------------------------------
# stats
# ---------------------------------------------------------------------------------------
def test_get_stats_counts_per_stage():
    def check(x):
        if x % 4 == 0:
            raise ValueError(f"bad {x}")
        return None if x % 4 == 1 else x  # 5 failed, 5 dropped, 10 kept

    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(check, concurrency=2, name="check")
        .pipe(_adouble, name="twice")
        .aggregate(4)
        .disaggregate()
        .add_sink(2)
        .build()
    )
    assert len(list(pipeline)) == 10
    stats = pipeline.get_stats()
    assert all(isinstance(s, StageStats) for s in stats)
    assert len(stats) == 5  # source + 4 stages
    names = ("source", "check", "twice", ":aggr", ":dis")
    by = {name: stage_stats(pipeline, name) for name in names}
    assert by["source"].num_out == 20
    assert (by["check"].num_in, by["check"].num_out, by["check"].num_failed) == (20, 10, 5)
    assert by["check"].concurrency == 2
    assert (by["twice"].num_in, by["twice"].num_out, by["twice"].num_failed) == (10, 10, 0)
    assert (by[":aggr"].num_in, by[":aggr"].num_out) == (10, 3)
    assert (by[":dis"].num_in, by[":dis"].num_out, by[":dis"].num_failed) == (3, 10, 0)
    assert "check" in pipeline.format_stats()


def test_get_stats_is_live_while_running():
    gate, entered = Gate(), threading.Event()

    def hold(x):
        if x == 3:
            entered.set()
            assert gate.wait()
        return x

    pipeline = PipelineBuilder().add_source(range(6)).pipe(hold, name="hold").add_sink(10).build()
    try:
        with pipeline.auto_stop():
            assert [pipeline.get_item(timeout=WAIT) for _ in range(3)] == [0, 1, 2]
            assert entered.wait(WAIT)
            live = stage_stats(pipeline, "hold")
            assert live.num_in == 4 and live.num_out == 3  # item 3 is inside the op
            gate.set()
            assert list(pipeline) == [3, 4, 5]
    finally:
        gate.set()
    assert stage_stats(pipeline, "hold").num_out == 6


class _SignalOnTable(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.logged = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "items/s" in record.getMessage():
            self.logged.set()


def test_report_stats_interval_logs_the_table(caplog):
    caplog.set_level(logging.INFO, logger="torch_spdl.pipeline")
    logger = logging.getLogger("torch_spdl.pipeline")
    handler = _SignalOnTable()
    logger.addHandler(handler)
    try:

        def wait_for_report(x):
            if x == 0:  # hold the pipeline open until a report was logged
                assert handler.logged.wait(WAIT), "no stats table was logged"
            return x

        pipeline = (
            PipelineBuilder()
            .add_source(range(5))
            .pipe(wait_for_report, name="reported_stage")
            .add_sink(2)
            .build(report_stats_interval=0.05)
        )
        assert list(pipeline) == list(range(5))
    finally:
        logger.removeHandler(handler)
    tables = [
        r.getMessage()
        for r in caplog.records
        if r.name == "torch_spdl.pipeline" and "items/s" in r.getMessage()
    ]
    assert tables
    assert all(r.levelno == logging.INFO for r in caplog.records if "items/s" in r.getMessage())
    assert "reported_stage" in tables[0]
    assert "source" in tables[0]


def test_no_stats_table_without_report_interval(caplog):
    caplog.set_level(logging.DEBUG, logger="torch_spdl.pipeline")
    assert list(PipelineBuilder().add_source(range(50)).pipe(_double).build()) == [
        2 * x for x in range(50)
    ]
    assert not [r for r in caplog.records if "items/s" in r.getMessage()]


# ---------------------------------------------------------------------------------------
# bounded memory
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_infinite_source_with_blocked_stage_stays_bounded(kind):
    """source -> identity[2] -> blocked[3] -> sink(4), every queue of 5: the source cannot
    run further ahead than the queues, workers and sink can hold."""
    q, conc1, conc2, sink = 5, 2, 3, 4
    source, gate = CountingSource(), Gate()

    pipeline = (
        PipelineBuilder()
        .add_source(source)
        .pipe(lambda x: x, concurrency=conc1)
        .pipe(gate.gated_op(kind), concurrency=conc2)
        .add_sink(sink)
        .build(queue_size=q)
    )
    saturated = 1 + q + conc1 + q + conc2  # every queue full, every worker holding one
    bound = 2 * q + conc1 + conc2 + sink + 1
    try:
        pipeline.start()
        # a hang guard with room: on a loaded slow machine WAIT alone once ran out here
        assert source.wait_until(lambda n: n >= saturated, 6 * WAIT), source.pulled
        assert not source.wait_until(lambda n: n > bound, 0.5), source.pulled
        # Counted while the gate holds: once it opens, items flow on until stop() lands.
        held = source.pulled
    finally:
        gate.set()
        pipeline.stop()
    assert held <= bound


def test_infinite_source_default_queues_stay_bounded():
    source, gate = CountingSource(), Gate()

    def blocked(x):
        assert gate.wait(30)
        return x

    pipeline = PipelineBuilder().add_source(source).pipe(blocked, concurrency=2).build()
    try:
        pipeline.start()
        # first, the source must be held back at all (it ran ahead and then stopped) ...
        assert source.wait_until(lambda n: n >= 2, WAIT)
        assert not source.wait_until(lambda n: n > 1000, 0.5), source.pulled
        held = source.pulled  # while the gate holds (see the test above)
    finally:
        gate.set()
        pipeline.stop()
    cap = stage_stats(pipeline, "blocked").queue_capacity
    assert 0 < cap and held <= cap + 2 + 3 + 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_input_order_with_slow_head_item_stays_bounded(kind):
    q, conc, sink = 4, 2, 2
    source, gate = CountingSource(), Gate()

    def head_blocks(x):
        if x == 0:
            assert gate.wait(30)
        return x

    async def ahead_blocks(x):
        if x == 0:
            assert await gate.await_(30)
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(source)
        .pipe(
            head_blocks if kind == "sync" else ahead_blocks,
            concurrency=conc,
            output_order="input",
        )
        .add_sink(sink)
        .build(queue_size=q)
    )
    bound = q + 2 * conc + sink + 1  # generous: SPDL holds at most `concurrency` in flight
    try:
        pipeline.start()
        assert source.wait_until(lambda n: n >= 1 + q + conc, WAIT), source.pulled
        assert not source.wait_until(lambda n: n > bound, 0.5), source.pulled
    finally:
        gate.set()
        pipeline.stop()


def test_async_input_order_with_idle_consumer_stays_bounded():
    q, conc, sink = 4, 2, 2
    source = CountingSource()

    async def identity(x):
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(source)
        .pipe(identity, concurrency=conc, output_order="input")
        .add_sink(sink)
        .build(queue_size=q)
    )
    bound = q + 2 * conc + sink + 1
    try:
        pipeline.start()
        assert source.wait_until(lambda n: n >= 1 + q + sink, WAIT), source.pulled
        assert not source.wait_until(lambda n: n > bound, 0.5), source.pulled
    finally:
        pipeline.stop()


# -- a process pool's stage sends chunks of small items ---------------------------------------
def _square_unless_13(x: int) -> int:
    if x == 13:
        raise ValueError("13 is unlucky")
    return x * x


@pytest.mark.parametrize("order", ["completion", "input"])
def test_process_pool_stage_delivers_each_item_once_and_fails_items_alone(order: str) -> None:
    """Small items go to the pool in chunks: each result once, in input order when asked,
    and a failing item fails alone (counted against max_failures)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        pipeline = (
            PipelineBuilder()
            .add_source(range(2000))
            .pipe(
                _square_unless_13, concurrency=3, executor=pool, output_order=order, max_failures=1
            )
            .add_sink(16)
            .build()
        )
        got = list(pipeline)
    want = [x * x for x in range(2000) if x != 13]
    assert (got if order == "input" else sorted(got)) == want
    stats = [s for s in pipeline.get_stats() if "square" in s.name]
    assert [(s.num_in, s.num_failed) for s in stats] == [(2000, 1)]
