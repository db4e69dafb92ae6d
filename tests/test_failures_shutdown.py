"""Failures and shutdown of ``torch_spdl.pipeline``: failed items, ``max_failures``, source
errors, dead subprocesses and process pools, and every way a consumer can stop early
(break, exception, KeyboardInterrupt, dropping the pipeline), none of which may hang or leave
a thread behind.

No test uses ``time.sleep`` to synchronise: threads meet on Events and Conditions, each with a
timeout, and every test runs under a 60 s timeout so a hang fails instead of blocking CI.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor

import pytest
from _sync import CHILD_S, CHILD_START_S, WAIT, Gate

from torch_spdl.pipeline import (
    PipelineBuilder,
    PipelineFailure,
    SubprocessError,
    iterate_in_subprocess,
    run_pipeline_in_subprocess,
)

pytestmark = pytest.mark.timeout(600)

LOGGER = "torch_spdl.pipeline"


class Boom(Exception):
    """The error our ops raise, so no other exception can be mistaken for it."""


class SourceBroke(Exception):
    pass


# Module-level so that subprocesses (spawn) can pickle them by reference.
def _die_midstream():
    yield 0
    yield 1
    yield 2
    os._exit(3)


def _raise_in_child():
    yield "a"
    raise Boom("raised in the child")


def _exit_at_5(x):
    if x == 5:
        os._exit(4)
    return x


def _exit_in_worker(x):
    if x == 5:
        os._exit(7)
    return x


def _stage(pipeline, fragment):
    matches = [s for s in pipeline.get_stats() if fragment in s.name]
    assert len(matches) == 1, [s.name for s in pipeline.get_stats()]
    return matches[0]


# ---------------------------------------------------------------------------------------
# a failing op drops the item, logs once, counts
# ---------------------------------------------------------------------------------------
def _failing_ops():
    def sync_op(x):
        if x == "sample-3":
            raise Boom("cannot parse")
        return x.upper()

    async def async_op(x):
        return sync_op(x)

    def gen_op(x):
        yield sync_op(x)

    async def agen_op(x):
        yield sync_op(x)

    return {"sync": sync_op, "async": async_op, "generator": gen_op, "async generator": agen_op}


@pytest.mark.parametrize("output_order", ["completion", "input"])
@pytest.mark.parametrize("kind", ["sync", "async", "generator", "async generator"])
def test_failed_item_is_dropped_logged_once_and_counted(kind, output_order, caplog):
    caplog.set_level(logging.ERROR, logger=LOGGER)
    items = [f"sample-{i}" for i in range(8)]
    pipeline = (
        PipelineBuilder()
        .add_source(items)
        .pipe(_failing_ops()[kind], concurrency=2, name="parse", output_order=output_order)
        .add_sink(2)
        .build()
    )
    out = list(pipeline)
    assert sorted(out) == sorted(i.upper() for i in items if i != "sample-3")
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert "parse" in message
    assert repr("sample-3") in message
    assert "cannot parse" in message
    stats = _stage(pipeline, "parse")
    assert (stats.num_in, stats.num_out, stats.num_failed) == (8, 7, 1)


# ---------------------------------------------------------------------------------------
# max_failures
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async", "generator"])
@pytest.mark.parametrize("max_failures", [0, 2])
def test_exceeding_max_failures_raises_pipeline_failure(kind, max_failures):
    raised: list[Boom] = []

    def check(x):
        if x % 3 == 1:
            raised.append(Boom(f"item {x}"))
            raise raised[-1]
        return x

    async def acheck(x):
        return check(x)

    def gcheck(x):
        yield check(x)

    op = {"sync": check, "async": acheck, "generator": gcheck}[kind]
    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())  # infinite: the failure cannot be "at the end"
        .pipe(op, name="check")
        .pipe(lambda x: x)
        .add_sink(2)
        .build(max_failures=max_failures)
    )
    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in pipeline:  # a plain loop: no auto_stop
            got.append(x)
    failure = info.value
    assert "check" in failure.stage
    assert "check" in str(failure)
    assert failure.num_failures == max_failures + 1
    assert len(raised) == max_failures + 1  # one worker: it stops at the failure
    assert failure.__cause__ is raised[-1]
    assert all(x % 3 != 1 for x in got)


def test_pipe_level_max_failures_overrides_build_level():
    raised: list[Boom] = []

    def strict(x):
        if x == 10:
            raised.append(Boom("strict stage"))
            raise raised[-1]
        return x

    def lenient(x):
        if x % 2:
            raise Boom("lenient stage")
        return x

    # the build allows any number, the stage none
    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())
        .pipe(lenient, name="lenient")
        .pipe(strict, name="strict", max_failures=0)
        .add_sink(2)
        .build(max_failures=-1)
    )
    with pytest.raises(PipelineFailure) as info:
        for _ in pipeline:
            pass
    assert "strict" in info.value.stage
    assert info.value.__cause__ is raised[0]

    # the build allows none, the stage any number; another stage inherits the build's 0
    raised.clear()
    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())
        .pipe(lenient, name="lenient", max_failures=-1)
        .pipe(strict, name="strict")
        .add_sink(2)
        .build(max_failures=0)
    )
    with pytest.raises(PipelineFailure) as info:
        for _ in pipeline:
            pass
    assert "strict" in info.value.stage
    assert info.value.__cause__ is raised[0]
    assert _stage(pipeline, "lenient").num_failed >= 5  # items 1, 3, ..., 9 at least


def test_pipe_level_unlimited_failures_lets_a_finite_run_complete():
    def lenient(x):
        if x % 2:
            raise Boom("odd")
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(lenient, name="lenient", max_failures=-1)
        .add_sink(2)
        .build(max_failures=0)
    )
    assert list(pipeline) == list(range(0, 20, 2))
    assert _stage(pipeline, "lenient").num_failed == 10


def test_max_failures_reaches_get_item_as_eof_and_stop_raises():
    def always(x):
        raise Boom(str(x))

    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())
        .pipe(always, name="always")
        .build(max_failures=1)
    )
    with pytest.raises(EOFError) as eof:
        pipeline.get_item(timeout=WAIT)
    assert isinstance(eof.value.__cause__, PipelineFailure)
    for _ in range(2):  # on every call
        with pytest.raises(PipelineFailure) as info:
            pipeline.stop()
        assert isinstance(info.value.__cause__, Boom)


# ---------------------------------------------------------------------------------------
# source errors
# ---------------------------------------------------------------------------------------
def _sync_source():
    yield from range(5)
    raise SourceBroke("the source broke")


async def _async_source():
    for i in range(5):
        await asyncio.sleep(0)
        yield i
    raise SourceBroke("the source broke")


async def _atimes10(x):
    return x * 10


@pytest.mark.parametrize("source", [_sync_source, _async_source])
@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("stage", ["sync", "async", "none"])
def test_source_error_after_earlier_items(source, concurrency, stage):
    builder = PipelineBuilder().add_source(source())
    if stage == "sync":
        builder.pipe(lambda x: x * 10, concurrency=concurrency).pipe(lambda x: x)
    elif stage == "async":
        builder.pipe(_atimes10, concurrency=concurrency)
    pipeline = builder.add_sink(2).build()
    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in pipeline:
            got.append(x)
    assert info.value.stage == "source"
    assert isinstance(info.value.__cause__, SourceBroke)
    assert info.group_contains(SourceBroke, match="the source broke")
    factor = 1 if stage == "none" else 10
    assert sorted(got) == [factor * i for i in range(5)]


def test_source_error_reaches_get_item_after_items():
    pipeline = PipelineBuilder().add_source(_sync_source()).pipe(lambda x: x).build()
    assert [pipeline.get_item(timeout=WAIT) for _ in range(5)] == list(range(5))
    with pytest.raises(EOFError):
        pipeline.get_item(timeout=WAIT)
    with pytest.raises(PipelineFailure) as info:
        pipeline.stop()
    assert info.group_contains(SourceBroke)


# ---------------------------------------------------------------------------------------
# leaving early: nothing may stay behind
# ---------------------------------------------------------------------------------------
async def _ainfinite():
    for i in itertools.count():
        await asyncio.sleep(0)
        yield i


async def _aident(x):
    return x


def _build_infinite(shape):
    if shape == "sync":
        builder = (
            PipelineBuilder()
            .add_source(itertools.count())
            .pipe(lambda x: x, concurrency=2)
            .aggregate(3)
            .disaggregate()
        )
    elif shape == "async":
        builder = PipelineBuilder().add_source(_ainfinite()).pipe(_aident, concurrency=2)
        builder.pipe(lambda x: x)
    elif shape == "input order":
        builder = (
            PipelineBuilder()
            .add_source(itertools.count())
            .pipe(lambda x: x, concurrency=2, output_order="input")
            .pipe(_aident, concurrency=2, output_order="input")
        )
    elif shape == "nested":
        inner = PipelineBuilder().add_source(itertools.count()).pipe(_aident).add_sink(2).build()
        builder = PipelineBuilder().add_source(inner).pipe(lambda x: x, concurrency=2)
    else:
        raise AssertionError(shape)
    return builder.add_sink(2).build(report_stats_interval=30)


SHAPES = ["sync", "async", "input order", "nested"]


@pytest.mark.parametrize("shape", SHAPES)
def test_break_leaves_no_thread(shape):
    before = threading.active_count()
    pipeline = _build_infinite(shape)
    got = []
    for x in pipeline:
        got.append(x)
        if len(got) == 10:
            break
    assert threading.active_count() == before
    assert len(got) == 10


@pytest.mark.parametrize("shape", SHAPES)
def test_exception_in_loop_body_leaves_no_thread(shape):
    before = threading.active_count()
    pipeline = _build_infinite(shape)
    with pytest.raises(Boom):
        for x in pipeline:
            if x >= 5:
                raise Boom("consumer")
    assert threading.active_count() == before


@pytest.mark.parametrize("shape", SHAPES)
def test_keyboard_interrupt_in_loop_body_leaves_no_thread(shape):
    before = threading.active_count()
    pipeline = _build_infinite(shape)
    with pytest.raises(KeyboardInterrupt):
        for x in pipeline:
            if x >= 5:
                raise KeyboardInterrupt
    assert threading.active_count() == before


def _innermost_library_frame(thread_ident: int) -> tuple[object, int] | None:
    """The thread's innermost frame and its position, if that frame is torch_spdl's code."""
    frame = sys._current_frames().get(thread_ident)
    if frame is None or not frame.f_globals.get("__name__", "").startswith("torch_spdl."):
        return None
    return frame, frame.f_lasti


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the test (a shell that started the suite in the
    background leaves SIGINT ignored, and the test interrupts the main thread with it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_keyboard_interrupt_while_blocked_waiting_leaves_no_thread(kind, default_sigint):
    assert threading.current_thread() is threading.main_thread()
    main_ident = threading.get_ident()
    gate = Gate()
    entered = threading.Event()
    problems: list[str] = []

    def blocked(x):
        entered.set()
        gate.wait(30)
        return x

    async def ablocked(x):
        entered.set()
        await gate.await_(30)
        return x

    def interrupter():
        try:
            if not entered.wait(WAIT):
                problems.append("the op was never entered")
                return
            # No item can come out while the op waits on the gate, so the consumer ends up
            # waiting inside the library: seen as the same library frame, at the same
            # instruction, on two looks in a row. (A bounded number of looks: a hang guard.)
            pause, last = threading.Event(), None
            for _ in range(int(WAIT / 0.01)):
                now = _innermost_library_frame(main_ident)
                if now is not None and now == last:
                    break
                last = now
                pause.wait(0.01)
            else:
                problems.append("the consumer never blocked")
                return
            signal.pthread_kill(main_ident, signal.SIGINT)
        finally:
            gate.set()  # let the op return, so that stop() does not wait on it

    before = threading.active_count()
    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())
        .pipe(blocked if kind == "sync" else ablocked)
        .add_sink(2)
        .build()
    )
    helper = threading.Thread(target=interrupter, name="interrupter")
    helper.start()
    interrupted = None
    try:
        for _ in pipeline:
            if problems:
                break
    except KeyboardInterrupt as exc:
        interrupted = exc
    finally:
        gate.set()
        helper.join(WAIT)
    assert not problems, problems
    assert interrupted is not None, "the loop ended without a KeyboardInterrupt"
    modules = []
    tb = interrupted.__traceback__
    while tb is not None:
        modules.append(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    assert modules[-1].startswith("torch_spdl."), modules  # raised where the consumer waited
    assert threading.active_count() == before


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("how", ["started", "iterated"])
def test_dropped_running_pipeline_stops_its_threads(shape, how):
    before = threading.active_count()
    pipeline = _build_infinite(shape)
    if how == "started":
        pipeline.start()
        assert pipeline.get_item(timeout=WAIT) is not None
    else:
        iterator = iter(pipeline)
        assert next(iterator) is not None
        del iterator
        # the iterator started the pipeline, so dropping it stopped the pipeline ...
        assert threading.active_count() == before
        # ... then a second pipeline, started by hand, exercises dropping the object itself
        pipeline = _build_infinite(shape)
        pipeline.start()
        # an item out means every thread is up (see test_stop_while_nested_source_starts)
        assert pipeline.get_item(timeout=WAIT) is not None
    assert threading.active_count() > before
    del pipeline
    gc.collect()
    assert threading.active_count() == before


@pytest.mark.parametrize("shape", SHAPES)
def test_stop_is_idempotent(shape):
    before = threading.active_count()
    pipeline = _build_infinite(shape)
    pipeline.start()
    assert pipeline.get_item(timeout=WAIT) is not None
    stoppers = [threading.Thread(target=pipeline.stop) for _ in range(3)]
    for t in stoppers:
        t.start()
    pipeline.stop()
    for t in stoppers:
        t.join(WAIT)
    assert not any(t.is_alive() for t in stoppers)
    assert threading.active_count() == before
    pipeline.stop()
    pipeline.stop()
    assert threading.active_count() == before


def test_stop_before_start_and_start_twice():
    pipeline = PipelineBuilder().add_source(range(3)).build()
    pipeline.stop()
    pipeline.stop()
    pipeline.start()  # a stop() before start() did nothing (as in SPDL)
    pipeline.stop()
    with pytest.raises(RuntimeError):
        pipeline.start()  # a pipeline runs once

    pipeline = PipelineBuilder().add_source(range(3)).build()
    with pipeline.auto_stop():
        with pytest.raises(RuntimeError):
            pipeline.start()


def test_stop_inside_the_loop_ends_iteration():
    before = threading.active_count()
    pipeline = _build_infinite("sync")
    got = []
    for x in pipeline:
        got.append(x)
        if len(got) == 3:
            pipeline.stop()
    assert got[:3] == got and len(got) == 3
    assert threading.active_count() == before


def test_auto_stop_with_exception_in_block():
    before = threading.active_count()
    pipeline = _build_infinite("async")
    with pytest.raises(Boom), pipeline.auto_stop():
        for x in pipeline:
            if x == 3:
                raise Boom("in block")
    assert threading.active_count() == before


def test_breaking_out_of_outer_pipeline_stops_the_inner_one():
    before = threading.active_count()
    inner = PipelineBuilder().add_source(itertools.count()).pipe(lambda x: x).build()
    outer = PipelineBuilder().add_source(inner).pipe(_aident).build()
    for x in outer:
        if x == 20:
            break
    assert threading.active_count() == before
    assert _stage(inner, "source").num_out > 20  # the inner pipeline did run


def test_stop_while_nested_source_starts():
    """Stop the outer pipeline while its source (an inner pipeline) is still starting."""
    before_threads = set(threading.enumerate())
    errors: list[BaseException] = []
    try:
        for _ in range(5):
            entered = threading.Event()

            def signal_op(x, entered=entered):
                entered.set()
                return x

            builder = PipelineBuilder().add_source(itertools.count()).pipe(signal_op)
            for _ in range(30):  # many stages: the inner start() takes a while
                builder.pipe(lambda x: x, concurrency=4)
            inner = builder.add_sink(2).build()
            outer = PipelineBuilder().add_source(inner).add_sink(2).build()
            before = threading.active_count()
            outer.start()  # its source thread starts the inner pipeline
            assert entered.wait(WAIT)  # the inner pipeline is part-way through starting
            try:
                outer.stop()  # stops the inner one too
            except RuntimeError as exc:
                errors.append(exc)
            else:
                assert threading.active_count() == before
    finally:  # whatever happened, leave no thread for the next test
        for thread in set(threading.enumerate()) - before_threads:
            thread.join(WAIT)
    assert not errors, errors


class _Part:
    """A wait outside the pipeline (a bound, a worker group), registered with it."""

    def __init__(self) -> None:
        self.released = Gate()
        self.calls = 0

    def shutdown(self) -> None:
        self.calls += 1
        self.released.set()


def _waits_on(part: _Part, started: Gate) -> Iterator[int]:
    yield 0
    started.set()
    part.released.wait()  # what only the part's shutdown ends
    yield 1


@pytest.mark.parametrize("how", ["stop", "drop"])
def test_a_registered_part_is_shut_down_and_its_waiter_returns(how):
    part, started = _Part(), Gate()
    builder = PipelineBuilder().add_source(_waits_on(part, started)).add_stoppable(part)
    pipeline = builder.add_sink(1).build()
    assert pipeline.get_item(timeout=WAIT) == 0
    assert started.wait()
    if how == "stop":
        pipeline.stop()
    else:
        del pipeline
        gc.collect()
    assert part.calls == 1
    assert not [t for t in threading.enumerate() if t.name == "torch_spdl-source"]


def test_a_part_of_a_pipeline_never_started_is_shut_down_too():
    part = _Part()
    pipeline = PipelineBuilder().add_source(range(3)).add_stoppable(part).add_sink(1).build()
    pipeline.stop()
    pipeline.stop()
    assert part.calls == 1


def test_add_stoppable_needs_a_shutdown_method():
    with pytest.raises(TypeError, match="shutdown"):
        PipelineBuilder().add_stoppable(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# subprocesses and process pools that die
# ---------------------------------------------------------------------------------------
def test_iterate_in_subprocess_child_exit_raises_subprocess_error():
    got = []
    with pytest.raises(SubprocessError) as info:  # a missed death would raise TimeoutError
        for x in iterate_in_subprocess(_die_midstream, timeout=CHILD_START_S):
            got.append(x)
    assert got == [0, 1, 2]
    assert "code 3" in str(info.value)


def test_iterate_in_subprocess_reraises_child_error():
    got = []
    with pytest.raises(Boom, match="raised in the child"):
        for x in iterate_in_subprocess(_raise_in_child, timeout=CHILD_START_S):
            got.append(x)
    assert got == ["a"]


def test_run_pipeline_in_subprocess_child_exit_raises_subprocess_error():
    builder = PipelineBuilder().add_source(range(20)).pipe(_exit_at_5).add_sink(2)
    got = []
    with pytest.raises(SubprocessError) as info:
        for x in run_pipeline_in_subprocess(builder, timeout=CHILD_START_S):
            got.append(x)
    assert got == list(range(len(got))) and len(got) <= 5
    assert "code 4" in str(info.value)


@pytest.mark.parametrize("output_order", ["completion", "input"])
def test_process_pool_worker_death_raises_pipeline_failure(output_order):
    ctx = mp.get_context("spawn")
    executor = ProcessPoolExecutor(max_workers=2, mp_context=ctx)
    try:
        pipeline = (
            PipelineBuilder()
            .add_source(itertools.count())
            .pipe(
                _exit_in_worker,
                concurrency=2,
                executor=executor,
                name="in_process",
                output_order=output_order,
            )
            .add_sink(2)
            .build()
        )
        got = []
        with pytest.raises(PipelineFailure) as info:
            for x in pipeline:
                got.append(x)
    finally:
        executor.shutdown(wait=True)
    assert "in_process" in info.value.stage
    assert isinstance(info.value.__cause__, BrokenExecutor)
    assert 5 not in got


_EXIT_SCRIPT = """
import atexit, threading

def report():  # registered first, so it runs after the finalizers run at exit
    alive = [t.name for t in threading.enumerate() if t.name.startswith("torch_spdl")]
    print("alive at exit:", alive, flush=True)

atexit.register(report)

import itertools
import torch
from torch_spdl.pipeline import PipelineBuilder

def work(i):
    return torch.ones(256, 256).matmul(torch.ones(256, 256)).sum().item() + i

pipeline = PipelineBuilder().add_source(itertools.count()).pipe(work, concurrency=2)
pipeline = pipeline.add_sink(4).build(num_threads=2)
it = iter(pipeline)
next(it)
print("leaving with the pipeline running", flush=True)
"""


@pytest.mark.timeout(CHILD_S)  # its child interpreter is guarded by CHILD_S, not the module's
def test_a_pipeline_running_at_interpreter_exit_is_stopped_first():
    """A script that ends while its pipeline runs exits cleanly: the pipeline's finalizer
    stops and joins its threads before the interpreter finalizes (a daemon thread inside a
    torch op during finalization could abort the process)."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True, timeout=CHILD_S
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "leaving with the pipeline running" in proc.stdout
    assert "alive at exit: []" in proc.stdout, proc.stdout
