"""SPDL compatibility: code written for ``spdl.pipeline`` behaves the same here.

Written from SPDL's documented behaviour (and the choices recorded in docs/spdl-compat.md
where we differ on purpose), through the public API only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from fractions import Fraction

import pytest
from _sync import CHILD_START_S, WAIT
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spdl.pipeline import (
    PipelineBuilder,
    PipelineFailure,
    StageInfo,
    TaskHook,
    TaskPerfStats,
    TaskStatsHook,
)


class Boom(Exception):
    pass


def _stage(pipeline, name):
    return next(s for s in pipeline.get_stats() if s.name.endswith(name))


def fail_when(pred):
    def op(x):
        if pred(x):
            raise Boom(f"bad item {x}")
        return x

    return op


# ---------------------------------------------------------------------------------------
# 1. max_failures: a count or a Fraction rate; build-level across stages
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [Fraction(0), Fraction(-1, 10), Fraction(11, 10)])
def test_a_rate_out_of_range_is_a_value_error_at_build(rate):
    builder = PipelineBuilder().add_source(range(3)).pipe(lambda x: x)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        builder.build(max_failures=rate)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        PipelineBuilder().add_source(range(3)).pipe(lambda x: x, max_failures=rate)


def test_max_failures_of_another_type_is_a_type_error():
    builder = PipelineBuilder().add_source(range(3)).pipe(lambda x: x)
    with pytest.raises(TypeError, match="Fraction"):
        builder.build(max_failures=0.1)


def test_a_rate_under_the_limit_lets_the_run_complete():
    pipeline = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(fail_when(lambda x: x % 20 == 0), name="five_percent")
        .add_sink(0)
        .build(max_failures=Fraction(1, 10))
    )
    assert list(pipeline) == [x for x in range(1000) if x % 20]
    assert _stage(pipeline, "five_percent").num_failed == 50


def test_a_fraction_is_a_rate_not_a_count():
    # as a count, Fraction(1, 2) would allow no failure at all
    pipeline = (
        PipelineBuilder()
        .add_source(range(300))
        .pipe(fail_when(lambda x: x == 7))
        .add_sink(0)
        .build(max_failures=Fraction(1, 2))
    )
    assert len(list(pipeline)) == 299


def test_a_rate_over_the_limit_fails_only_after_the_probation():
    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())  # infinite: only the rate can stop it
        .pipe(fail_when(lambda x: x % 4 == 0), name="quarter")
        .add_sink(2)
        .build(max_failures=Fraction(1, 10))
    )
    with pytest.raises(PipelineFailure) as info:
        for _ in pipeline:
            pass
    assert info.value.stage.endswith("quarter")
    assert isinstance(info.value.__cause__, Boom)
    assert _stage(pipeline, "quarter").num_in >= 100  # the probation: 100 items
    assert any("max_failures=1/10" in note for note in info.value.__cause__.__notes__)


def test_failures_during_the_probation_count_when_the_stage_ends():
    # 30 failures in the first 30 items, then none: 30/200 > 1/10, found at the end
    pipeline = (
        PipelineBuilder()
        .add_source(range(200))
        .pipe(fail_when(lambda x: x < 30), name="early")
        .add_sink(0)
        .build(max_failures=Fraction(1, 10))
    )
    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in pipeline:
            got.append(x)
    assert got == list(range(30, 200))  # everything made is delivered first
    assert "30 failures in 200 items" in str(info.value)


def test_failures_during_the_probation_alone_do_not_trip_a_rate_met_overall():
    pipeline = (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(fail_when(lambda x: x < 10))
        .add_sink(0)
        .build(max_failures=Fraction(1, 50))  # 10/1000 = 1/100
    )
    assert list(pipeline) == list(range(10, 1000))


def test_the_build_level_limit_counts_failures_across_stages():
    def builder():
        return (
            PipelineBuilder()
            .add_source(range(50))
            .pipe(fail_when(lambda x: x in (3, 4)), name="a")
            .pipe(fail_when(lambda x: x in (10, 11)), name="b")
            .add_sink(0)
        )

    # 2 failures in each stage, 4 in all: over a build-level 3
    with pytest.raises(PipelineFailure) as info:
        list(builder().build(max_failures=3))
    assert info.value.stage.endswith("b")
    # the same limit given to each stage is met
    per_stage = (
        PipelineBuilder()
        .add_source(range(50))
        .pipe(fail_when(lambda x: x in (3, 4)), name="a", max_failures=3)
        .pipe(fail_when(lambda x: x in (10, 11)), name="b", max_failures=3)
        .add_sink(0)
        .build(max_failures=0)
    )
    assert len(list(per_stage)) == 46


@settings(max_examples=25, deadline=None)
@given(
    fails=st.lists(st.booleans(), min_size=1, max_size=300),
    num=st.integers(1, 10),
    den=st.integers(1, 10),
)
def test_a_rate_trips_exactly_when_the_final_rate_exceeds_it(fails, num, den):
    # one worker, finite source: every failure is checked after the probation or at the end,
    # so a run fails exactly when the rate at some check point exceeds the limit
    rate = Fraction(min(num, den), den)
    bad = {i for i, f in enumerate(fails) if f}
    pipeline = (
        PipelineBuilder()
        .add_source(range(len(fails)))
        .pipe(fail_when(lambda x: x in bad))
        .add_sink(0)
        .build(max_failures=rate)
    )
    probation = max(100, -(-rate.denominator // rate.numerator))
    seen = 0
    trips = False
    for i in range(len(fails)):
        if i in bad:
            seen += 1
            if i + 1 >= probation and Fraction(seen, i + 1) > rate:
                trips = True
                break
    if not trips and len(fails) >= probation and Fraction(len(bad), len(fails)) > rate:
        trips = True
    if trips:
        with pytest.raises(PipelineFailure):
            list(pipeline)
    else:
        assert list(pipeline) == [x for x in range(len(fails)) if x not in bad]


# ---------------------------------------------------------------------------------------
# 2. when a failure reaches the consumer
# ---------------------------------------------------------------------------------------
def _fails_at(k):
    """source -> fail on item k (no failure allowed) -> identity; one worker each."""
    return (
        PipelineBuilder()
        .add_source(range(1000))
        .pipe(fail_when(lambda x: x == k), name="check")
        .pipe(lambda x: x, name="after")
        .add_sink(0)
        .build(max_failures=0)
    )


def test_a_plain_loop_gets_every_item_made_then_the_failure():
    pipeline = _fails_at(7)
    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in pipeline:
            got.append(x)
    assert got == list(range(7))
    assert info.value.stage.endswith("check")


def test_inside_auto_stop_the_loop_ends_and_leaving_raises():
    pipeline = _fails_at(7)
    got = []
    with pytest.raises(PipelineFailure) as info:
        with pipeline.auto_stop():
            for x in pipeline:
                got.append(x)
            assert got == list(range(7))  # the loop ended quietly
            with pytest.raises(EOFError):
                pipeline.get_item(timeout=WAIT)
    assert isinstance(info.value.__cause__, Boom)
    for _ in range(2):  # again on every later call
        with pytest.raises(PipelineFailure):
            pipeline.stop()


def test_explicit_start_and_stop_follow_spdl():
    pipeline = _fails_at(3)
    pipeline.start()
    got = [pipeline.get_item(timeout=WAIT) for _ in range(3)]
    assert got == [0, 1, 2]
    with pytest.raises(EOFError):
        pipeline.get_item(timeout=WAIT)
    with pytest.raises(PipelineFailure):
        pipeline.stop()


def test_an_error_in_the_auto_stop_block_is_not_masked():
    pipeline = _fails_at(3)
    with pytest.raises(KeyError):
        with pipeline.auto_stop():
            list(pipeline)
            raise KeyError("mine")
    with pytest.raises(PipelineFailure):  # still readable
        pipeline.stop()


def test_stop_before_start_is_a_no_op():
    pipeline = _fails_at(3)
    pipeline.stop()
    pipeline.stop()


def test_a_successful_pipeline_stops_quietly():
    pipeline = PipelineBuilder().add_source(range(5)).pipe(lambda x: x).build()
    with pipeline.auto_stop(timeout=WAIT):
        assert list(pipeline) == list(range(5))
    pipeline.stop(timeout=WAIT)


# ---------------------------------------------------------------------------------------
# 4. PipelineFailure's shape, source failures
# ---------------------------------------------------------------------------------------
def test_pipeline_failure_is_an_exception_group_of_the_stage_errors():
    pipeline = _fails_at(2)
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    failure = info.value
    assert isinstance(failure, ExceptionGroup)
    assert isinstance(failure, RuntimeError)  # what torch_spdl code caught before
    assert failure.message == "pipeline stages failed"
    (error,) = failure.exceptions
    assert isinstance(error, Boom) and failure.__cause__ is error
    assert any("'1:check'" in n and "item 2" in n for n in error.__notes__)
    assert "1:check" in str(failure) and "bad item 2" in str(failure)
    sub = failure.subgroup(Boom)
    assert isinstance(sub, PipelineFailure) and sub.stage == "1:check"
    assert failure.subgroup(KeyError) is None


def test_except_star_catches_the_stage_error():
    caught = []
    try:
        list(_fails_at(2))
    except* Boom as group:
        caught.extend(group.exceptions)
    assert len(caught) == 1


def _broken_source():
    yield from range(4)
    raise Boom("the source broke")


@pytest.mark.parametrize("stage", ["sync", "none"])
def test_a_failing_source_is_part_of_the_failure_after_its_items(stage):
    builder = PipelineBuilder().add_source(_broken_source())
    if stage == "sync":
        builder.pipe(lambda x: x * 10)
    pipeline = builder.add_sink(0).build()
    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in pipeline:
            got.append(x)
    factor = 10 if stage == "sync" else 1
    assert got == [factor * i for i in range(4)]
    assert info.value.stages == ("source",)
    assert any("source" in n for n in info.value.exceptions[0].__notes__)


def test_errors_of_several_stages_are_all_in_the_group():
    b_failed = threading.Event()

    def a(x):
        if x == 3:
            b_failed.wait(WAIT)
            raise Boom("a")
        return x

    def b(x):
        if x == 1:
            b_failed.set()
            raise Boom("b")
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .pipe(a, name="a", max_failures=0)
        .pipe(b, name="b", max_failures=0)
        .add_sink(0)
        .build()
    )
    with pytest.raises(PipelineFailure) as info:
        with pipeline.auto_stop():
            assert list(pipeline) == [0]
    assert sorted(info.value.stages) == ["1:a", "2:b"]
    assert {str(e) for e in info.value.exceptions} == {"a", "b"}


def test_pipeline_failure_pickles():
    with pytest.raises(PipelineFailure) as info:
        list(_fails_at(2))
    copy = pickle.loads(pickle.dumps(info.value))
    assert isinstance(copy, PipelineFailure)
    assert (copy.stage, copy.num_failures, copy.message) == ("1:check", 1, info.value.message)
    assert str(copy.exceptions[0]) == "bad item 2"


# ---------------------------------------------------------------------------------------
# 3. task hooks
# ---------------------------------------------------------------------------------------
class Recorder(TaskHook):
    """Records the stage's enter/exit and every task's input and outcome."""

    def __init__(self, info, fail_on=None):
        self.info = info
        self.events = []
        self.fail_on = fail_on

    @asynccontextmanager
    async def stage_hook(self):
        self.events.append("enter")
        yield
        self.events.append("exit")

    @asynccontextmanager
    async def task_hook(self, input_item=None):
        if input_item == self.fail_on:
            raise Boom(f"hook refused {input_item}")
        try:
            yield
        except StopAsyncIteration:
            raise
        except Exception:
            self.events.append(("failed", input_item))
            raise
        self.events.append(("ok", input_item))


def _recording(**kwargs):
    hooks = {}

    def factory(info):
        assert isinstance(info, StageInfo)
        hooks[info.name] = Recorder(info, **kwargs)
        return [hooks[info.name]]

    return hooks, factory


async def _adouble(x):
    return 2 * x


def _gen2(x):
    yield x
    yield -x


async def _agen2(x):
    yield x
    yield -x


@pytest.mark.parametrize("kind", ["sync", "async", "executor", "ordered"])
def test_task_hooks_wrap_every_item_and_stage_hooks_the_stage(kind):
    hooks, factory = _recording()
    builder = PipelineBuilder().add_source(range(6))
    if kind == "sync":
        builder.pipe(lambda x: 2 * x, name="op", concurrency=2)
    elif kind == "async":
        builder.pipe(_adouble, name="op", concurrency=2)
    elif kind == "executor":
        pool = ThreadPoolExecutor(max_workers=2)
        builder.pipe(lambda x: 2 * x, name="op", concurrency=2, executor=pool)
    else:
        builder.pipe(lambda x: 2 * x, name="op", concurrency=2, output_order="input")
    pipeline = builder.add_sink(0).build(task_hook_factory=factory)
    try:
        assert sorted(pipeline) == [2 * x for x in range(6)]
    finally:
        if kind == "executor":
            pool.shutdown()
    (events,) = [h.events for h in hooks.values()]
    assert events[0] == "enter" and events[-1] == "exit"
    assert sorted(e[1] for e in events[1:-1]) == list(range(6))
    assert {e[0] for e in events[1:-1]} == {"ok"}


@pytest.mark.parametrize("op", [_gen2, _agen2])
def test_a_generator_op_is_one_task_per_step(op):
    stats = {}

    def factory(info):
        stats[info.name] = TaskStatsHook(info)
        return [stats[info.name]]

    pipeline = PipelineBuilder().add_source(range(3)).pipe(op).add_sink(0)
    assert sorted(pipeline.build(task_hook_factory=factory)) == [-2, -1, 0, 0, 1, 2]
    (hook,) = stats.values()
    assert (hook.num_tasks, hook.num_success) == (6, 6)  # the end of a generator is no task


def test_aggregate_is_one_task_per_item_and_every_stage_gets_hooks():
    stats = {}

    def factory(info):
        stats[info.name] = TaskStatsHook(info)
        return [stats[info.name]]

    pipeline = (
        PipelineBuilder()
        .add_source(range(5))
        .pipe(lambda x: x, name="id")
        .aggregate(2)
        .disaggregate()
        .add_sink(0)
        .build(task_hook_factory=factory, stage_id=7)
    )
    assert sorted(pipeline) == list(range(5))
    assert list(stats) == ["1:id", "2:aggregate(2)", "3:disaggregate"]
    # as in SPDL, aggregate's flush at the end of the stream is one more task
    assert [stats[n].num_tasks for n in stats] == [5, 6, 5]
    assert stats["1:id"].info.stage_id == 7 and stats["1:id"].info.index == 1


def test_task_stats_hook_counts_failures():
    stats = []

    def factory(info):
        stats.append(TaskStatsHook(info))
        return stats[-1:]

    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .pipe(fail_when(lambda x: x % 5 == 0))
        .add_sink(0)
        .build(task_hook_factory=factory)
    )
    assert len(list(pipeline)) == 8
    perf = stats[0].stats()
    assert isinstance(perf, TaskPerfStats)
    assert (perf.num_tasks, perf.num_failures) == (10, 2)
    assert perf.ave_time >= 0


def test_a_task_hook_error_drops_the_item_only():
    hooks, factory = _recording(fail_on=3)
    pipeline = (
        PipelineBuilder().add_source(range(6)).pipe(lambda x: x, name="op").add_sink(0)
    ).build(task_hook_factory=factory)
    assert list(pipeline) == [0, 1, 2, 4, 5]
    assert _stage(pipeline, "op").num_failed == 1


class _BadStageHook(TaskHook):
    @asynccontextmanager
    async def stage_hook(self):
        raise Boom("stage hook broke")
        yield

    @asynccontextmanager
    async def task_hook(self, input_item=None):
        yield


def test_a_stage_hook_error_fails_the_pipeline():
    pipeline = (
        PipelineBuilder().add_source(range(6)).pipe(lambda x: x, name="op").add_sink(0)
    ).build(task_hook_factory=lambda info: [_BadStageHook()])
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert info.value.stage == "1:op"
    assert info.group_contains(Boom, match="stage hook broke")


class _NotAsync(TaskHook):
    def task_hook(self, input_item=None):  # a plain method, not an async context manager
        return None


def test_a_hook_that_is_not_an_async_context_manager_is_rejected_at_build():
    builder = PipelineBuilder().add_source(range(3)).pipe(lambda x: x, name="op")
    with pytest.raises(ValueError, match="'1:op'.*asynccontextmanager"):
        builder.build(task_hook_factory=lambda info: [_NotAsync()])


@pytest.mark.parametrize("op", [fail_when(lambda x: x == 5), "async"])
def test_an_input_order_stage_that_fails_delivers_in_order_and_ends(op):
    if op == "async":

        async def op(x):
            if x == 5:
                raise Boom("bad item 5")
            return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(100))
        .pipe(op, concurrency=3, output_order="input", max_failures=0, name="ordered")
        .add_sink(0)
        .build()
    )
    got = []
    with pytest.raises(PipelineFailure):
        for x in pipeline:
            got.append(x)
    expected = [x for x in range(100) if x != 5]
    assert got[:5] == [0, 1, 2, 3, 4] and got == expected[: len(got)]


# ---------------------------------------------------------------------------------------
# 8. torch_spdl.pipeline.defs
# ---------------------------------------------------------------------------------------
def _triple(x):
    return 3 * x


def test_a_pipeline_declared_with_defs_builds_like_the_builder():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import (
        Aggregate,
        Disaggregate,
        Pipe,
        PipelineConfig,
        SinkConfig,
        SourceConfig,
    )

    config = PipelineConfig(
        src=SourceConfig(range(10)),
        pipes=[
            Pipe(_triple, concurrency=2, output_order="input", name="triple"),
            Aggregate(4),
            Pipe(sum),
            Aggregate(2, drop_last=True),
            Disaggregate(),
        ],
        sink=SinkConfig(5),
    )
    pipeline = build_pipeline(config, num_threads=2, max_failures=Fraction(1, 2))
    assert list(pipeline) == [18, 66]
    assert [s.name for s in pipeline.get_stats()][1] == "1:triple"
    assert pickle.loads(pickle.dumps(config)) == config


def test_defs_check_what_they_declare():
    from torch_spdl.pipeline.defs import Aggregate, Pipe, PipelineConfig, SinkConfig, SourceConfig

    with pytest.raises(ValueError, match="concurrency"):
        Pipe(_triple, concurrency=0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Pipe(_triple, max_failures=Fraction(2))
    with pytest.raises(ValueError, match="positive int"):
        Aggregate(0)
    with pytest.raises(TypeError, match="iterable"):
        SourceConfig(3)
    with pytest.raises(ValueError, match="buffer_size"):
        SinkConfig(-1)
    with pytest.raises(TypeError, match="Pipe, Aggregate, Disaggregate or PathVariants"):
        PipelineConfig(SourceConfig([]), [_triple])


def test_a_builder_pickles_and_builds_the_same_after():
    builder = PipelineBuilder().add_source(range(5)).pipe(_triple).aggregate(2).add_sink(4)
    copy = pickle.loads(pickle.dumps(builder))
    assert list(copy.build()) == list(builder.build()) == [[0, 3], [6, 9], [12]]


# ---------------------------------------------------------------------------------------
# 8. torch_spdl.source
# ---------------------------------------------------------------------------------------
class _Shuffled:
    def __init__(self, n):
        self.items = list(range(n))
        self.seeds = []

    def shuffle(self, seed):
        self.seeds.append(seed)
        random.Random(seed).shuffle(self.items)

    def __iter__(self):
        return iter(list(self.items))

    def __len__(self):
        return len(self.items)


def test_source_protocols_fit_any_object_with_the_methods():
    from torch_spdl.source import DistributedRandomSampler, IterableWithShuffle, SizedIterable

    assert isinstance(_Shuffled(3), IterableWithShuffle)
    assert isinstance(_Shuffled(3), SizedIterable)
    assert isinstance([1, 2], SizedIterable) and not isinstance([1, 2], IterableWithShuffle)
    assert isinstance(DistributedRandomSampler(8, rank=0, world_size=1), SizedIterable)


def test_repeat_source_reshuffles_every_epoch_from_its_number():
    from torch_spdl.source.utils import repeat_source

    src = _Shuffled(4)
    got = list(itertools.islice(repeat_source(src, epoch=5), 12))
    assert src.seeds == [5, 6, 7]
    assert all(sorted(got[i : i + 4]) == [0, 1, 2, 3] for i in (0, 4, 8))
    assert list(itertools.islice(repeat_source([1, 2]), 5)) == [1, 2, 1, 2, 1]


def test_merge_iterator_takes_turns_and_stops_as_asked():
    from torch_spdl.source.utils import MergeIterator

    its = [[0, 1, 2], [10, 11], [20, 21, 22]]
    assert list(MergeIterator(its)) == [0, 10, 20, 1, 11, 21, 2, 22]
    assert list(MergeIterator(its, stop_after=-1)) == [0, 10, 20, 1, 11, 21, 2]
    assert list(MergeIterator(its, stop_after=5)) == [0, 10, 20, 1, 11]
    with pytest.raises(ValueError):
        MergeIterator([])
    with pytest.raises(ValueError, match="weights"):
        MergeIterator(its, weights=[1, 0, 1])


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20), min_size=1, max_size=4),
    seed=st.integers(0, 100),
    data=st.data(),
)
def test_weighted_merge_yields_every_item_once_in_each_sources_order(sizes, seed, data):
    from torch_spdl.source.utils import MergeIterator

    weights = data.draw(st.lists(st.floats(0.1, 10), min_size=len(sizes), max_size=len(sizes)))
    its = [[(k, i) for i in range(n)] for k, n in enumerate(sizes)]
    got = list(MergeIterator(its, weights=weights, seed=seed))
    assert sorted(got) == sorted(x for it in its for x in it)
    for k in range(len(sizes)):
        assert [x for x in got if x[0] == k] == its[k]
    assert got == list(MergeIterator(its, weights=weights, seed=seed))  # reproducible


# ---------------------------------------------------------------------------------------
# 7. an async op that cannot be called fails the stage
# ---------------------------------------------------------------------------------------
async def _two_args(x, y):
    return x + y


async def _two_args_gen(x, y):
    yield x + y


@pytest.mark.parametrize("op", [_two_args, _two_args_gen])
@pytest.mark.parametrize("order", ["completion", "input"])
@pytest.mark.parametrize("hooked", [False, True])
def test_an_async_op_that_raises_on_being_called_fails_the_stage(op, order, hooked):
    if op is _two_args_gen and order == "input":
        order = "completion"  # an async generator streams its outputs
    factory = (lambda info: [TaskStatsHook(info)]) if hooked else None
    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .pipe(op, name="wrong", concurrency=2, output_order=order)
        .add_sink(0)
        .build(task_hook_factory=factory)  # no max_failures: it is not an item's failure
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert info.value.stage == "1:wrong"
    error = info.value.__cause__
    assert isinstance(error, TypeError)
    assert any("exactly one argument" in note for note in error.__notes__)


def test_get_item_after_stop_returns_what_is_buffered_then_eof():
    made = threading.Event()

    def source():
        yield from range(5)
        made.set()  # runs once the last item is in the sink

    pipeline = PipelineBuilder().add_source(source()).add_sink(10).build()
    pipeline.start()
    assert made.wait(WAIT)
    pipeline.stop()
    assert [pipeline.get_item(timeout=WAIT) for _ in range(5)] == list(range(5))
    with pytest.raises(EOFError):
        pipeline.get_item(timeout=WAIT)


def test_get_item_after_stop_hands_out_at_most_the_sink_size():
    """SPDL's ``get_item`` after ``stop()``: what the sink holds, up to its size, then EOF.
    An item its producer handed over past that size is still the producer's, and a stop
    drops what the stages hold (SPDL's own test reads exactly one item from a sink of 1)."""
    past = threading.Event()

    def passthrough(x):
        if x == 6:
            past.set()  # 5 is in the full sink; 6 goes past its size
        return x

    pipeline = (
        PipelineBuilder().add_source(range(10)).pipe(passthrough).add_sink(1).build(num_threads=1)
    )
    with pipeline.auto_stop():
        assert [pipeline.get_item(timeout=WAIT) for _ in range(5)] == list(range(5))
        assert past.wait(WAIT)
    kept = []
    with contextlib.suppress(EOFError):
        while True:
            kept.append(pipeline.get_item(timeout=WAIT))
    assert kept == [5]


def test_get_item_after_stop_counts_what_an_iteration_took_against_the_sink_size():
    """An iteration takes ready items from the sink in bulk (up to half of it); after
    ``stop()`` those come first, and with what the sink still held they make at most the
    sink's size, as in SPDL, where they would still take up its room."""
    full = threading.Event()

    def source():
        for i in range(100):
            if i == 12:  # 0 handed out, 1-3 taken with it, 4-11 fill the sink of 8
                full.set()
            yield i

    pipeline = PipelineBuilder().add_source(source()).add_sink(8).build()
    pipeline.start()
    try:
        assert next(iter(pipeline)) == 0
        assert full.wait(WAIT)
    finally:
        pipeline.stop()
    kept = []
    with contextlib.suppress(EOFError):
        while True:
            kept.append(pipeline.get_item(timeout=WAIT))
    assert kept == list(range(1, 9))


# ---------------------------------------------------------------------------------------
# 7. aggregate(Aggregator)
# ---------------------------------------------------------------------------------------
def _joiner():
    from torch_spdl.pipeline.defs import Aggregator

    class Joiner(Aggregator):
        """Joins strings until they reach 5 characters."""

        def __init__(self):
            self.parts = []

        def accumulate(self, item):
            if item == "bad":
                raise Boom("cannot take 'bad'")
            self.parts.append(item)
            if sum(map(len, self.parts)) >= 5:
                out, self.parts = "".join(self.parts), []
                return out
            return None

        def flush(self):
            out, self.parts = "".join(self.parts), []
            return out or None

    return Joiner()


WORDS = ["ab", "cde", "f", "ghij", "k", "bad", "l"]


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_custom_aggregator_decides_the_groups(drop_last):
    builder = PipelineBuilder().add_source(WORDS).aggregate(_joiner(), drop_last=drop_last)
    builder.add_sink(0)
    expected = ["abcde", "fghij"] + ([] if drop_last else ["kl"])
    for _ in range(2):  # each build works on its own copy of the aggregator
        pipeline = builder.build()
        assert list(pipeline) == expected
        assert _stage(pipeline, "aggregate(Joiner)").num_failed == 1  # 'bad' is dropped


def test_collate_and_aggregate_of_an_int_are_the_same():
    from torch_spdl.pipeline.defs import Aggregate, Collate, PipelineConfig, SourceConfig

    config = PipelineConfig(SourceConfig(range(7)), [Aggregate(Collate(3))])
    from torch_spdl.pipeline import build_pipeline

    expected = [[0, 1, 2], [3, 4, 5], [6]]
    assert list(build_pipeline(config)) == expected
    assert list(PipelineBuilder().add_source(range(7)).aggregate(3).build()) == expected


def test_an_aggregator_whose_flush_raises_fails_the_pipeline_after_its_groups():
    from torch_spdl.pipeline.defs import Collate

    class BadFlush(Collate):
        def flush(self):
            raise Boom("flush broke")

    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in PipelineBuilder().add_source(range(5)).aggregate(BadFlush(2)).build():
            got.append(x)
    assert got == [[0, 1], [2, 3]]
    assert info.group_contains(Boom, match="flush broke")


# ---------------------------------------------------------------------------------------
# 5. run_pipeline_in_subprocess takes a PipelineConfig
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", [None, "thread", "process"])
def test_run_pipeline_in_subprocess_takes_a_config_with_its_pools(pool):
    from concurrent.futures import ProcessPoolExecutor

    from torch_spdl.pipeline import run_pipeline_in_subprocess
    from torch_spdl.pipeline.defs import Aggregate, Pipe, PipelineConfig, SourceConfig

    executor = {
        None: None,
        "thread": ThreadPoolExecutor(max_workers=2),
        "process": ProcessPoolExecutor(max_workers=1),
    }[pool]
    try:
        config = PipelineConfig(
            SourceConfig(range(6)),
            [Pipe(_triple, executor=executor, concurrency=2, output_order="input"), Aggregate(4)],
        )
        result = run_pipeline_in_subprocess(config, num_threads=2)
        assert list(result) == [[0, 3, 6, 9], [12, 15]]
        assert list(result) == [[0, 3, 6, 9], [12, 15]]  # iterated again: a fresh run
    finally:
        if executor is not None:
            executor.shutdown()


def test_run_pipeline_in_subprocess_still_takes_a_builder_with_a_warning():
    from torch_spdl.pipeline import run_pipeline_in_subprocess

    builder = PipelineBuilder().add_source(range(4)).pipe(_triple)
    with pytest.warns(DeprecationWarning, match="get_config"):
        result = run_pipeline_in_subprocess(builder)
    assert list(result) == [0, 3, 6, 9]


# ---------------------------------------------------------------------------------------
# 8. small names
# ---------------------------------------------------------------------------------------
def test_create_task_logs_a_failure_nobody_awaits(caplog):
    import asyncio

    from torch_spdl.pipeline import create_task

    async def broken():
        raise Boom("lost otherwise")

    async def main():
        task = create_task(broken(), name="bg")
        await asyncio.wait([task])
        return task

    task = asyncio.run(main())
    assert isinstance(task.exception(), Boom)
    assert any("'bg' failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["iterate_in_subinterpreter", "run_pipeline_in_subinterpreter"])
def test_subinterpreter_entry_points_say_what_they_need(name):
    import sys

    import torch_spdl.pipeline as tp

    expected = RuntimeError if sys.version_info < (3, 14) else NotImplementedError
    with pytest.raises(expected, match="subprocess"):
        getattr(tp, name)(lambda: iter(()))


# ---------------------------------------------------------------------------------------
# 8. background tasks
# ---------------------------------------------------------------------------------------
def test_a_background_task_lives_from_start_to_stop():
    import asyncio

    from torch_spdl.pipeline import BackgroundTask

    started, cancelled = threading.Event(), threading.Event()

    class Monitor(BackgroundTask):
        async def run(self):
            started.set()
            try:
                await asyncio.get_running_loop().create_future()  # forever
            finally:
                cancelled.set()

    pipeline = (
        PipelineBuilder()
        .add_source(range(5))
        .pipe(lambda x: x)  # sync only: the loop exists for the background task alone
        .add_sink(0)
        .build(background_tasks=[Monitor])
    )
    with pipeline.auto_stop():
        assert started.wait(WAIT)
        assert list(pipeline) == list(range(5))
        assert not cancelled.is_set()
    assert cancelled.is_set()


def test_a_background_task_takes_its_first_step_before_any_item_moves():
    # A short pipeline of sync stages could finish before the event loop ran its
    # background tasks at all (a queue class's stage hooks were once never entered, under
    # load); start() now lets each take its first step before the stages start.
    from torch_spdl.pipeline import BackgroundTask

    order: list = []

    class First(BackgroundTask):
        async def run(self):
            order.append("background")

    def op(x):
        order.append("op")
        return x

    pipeline = PipelineBuilder().add_source(range(3)).pipe(op).add_sink(0)
    with pipeline.build(background_tasks=[First]).auto_stop() as running:
        assert list(running) == [0, 1, 2]
    assert order[0] == "background", order


def test_a_failing_background_task_is_logged_and_the_pipeline_goes_on(caplog):
    from torch_spdl.pipeline import BackgroundTask

    class Broken(BackgroundTask):
        async def run(self):
            raise Boom("monitor broke")

    pipeline = PipelineBuilder().add_source(range(5)).pipe(_adouble).add_sink(0)
    with pipeline.build(background_tasks=[Broken]).auto_stop() as running:
        assert list(running) == [0, 2, 4, 6, 8]
    assert any("monitor broke" in r.getMessage() for r in caplog.records)


@given(n=st.integers(0, 50), world=st.integers(1, 5))
def test_deterministic_sampler_ranks_cover_the_indices_once_in_order(n, world):
    from torch_spdl.source import DistributedDeterministicSampler

    shares = [
        list(DistributedDeterministicSampler(n, rank=r, world_size=world)) for r in range(world)
    ]
    assert sorted(x for share in shares for x in share) == list(range(n))
    for r, share in enumerate(shares):
        assert share == list(range(r, n, world))
        sampler = DistributedDeterministicSampler(n, rank=r, world_size=world)
        assert list(sampler) == list(sampler) and len(sampler) == len(share)


def test_embed_shuffle_reshuffles_on_every_iteration():
    from torch_spdl.source.utils import embed_shuffle

    src = _Shuffled(6)
    shuffled = embed_shuffle(src, epoch=3)
    first, second = list(shuffled), list(shuffled)
    assert src.seeds == [3, 4]
    assert sorted(first) == sorted(second) == list(range(6)) and len(shuffled) == 6
    with pytest.raises(TypeError, match="shuffle"):
        embed_shuffle([1, 2])


@settings(max_examples=10, deadline=None)
@given(n=st.integers(0, 300), concurrency=st.integers(1, 6), period=st.integers(2, 9))
def test_task_stats_hook_counts_every_task_with_many_workers(n, concurrency, period):
    hooks = []

    def factory(info):
        hooks.append(TaskStatsHook(info))
        return hooks[-1:]

    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(fail_when(lambda x: x % period == 0), concurrency=concurrency)
        .add_sink(0)
        .build(task_hook_factory=factory)
    )
    assert len(list(pipeline)) == n - len(range(0, n, period))
    perf = hooks[0].stats()
    assert (perf.num_tasks, perf.num_failures) == (n, len(range(0, n, period)))


# ---------------------------------------------------------------------------------------
# 6. Queues: AsyncQueue, StatsQueue, QueuePerfStats, build(queue_class=...)
# ---------------------------------------------------------------------------------------
def test_a_queue_class_gets_one_queue_per_boundary_with_its_hook_around_the_run():
    from torch_spdl.pipeline import AsyncQueue

    made: list = []
    events: list = []

    class Recording(AsyncQueue):
        def __init__(self, name, *, buffer_size=1):
            super().__init__(name, buffer_size=buffer_size)
            made.append((name, buffer_size))

        @asynccontextmanager
        async def stage_hook(self):
            events.append(("enter", self.name))
            yield
            events.append(("exit", self.name))

    pipeline = (
        PipelineBuilder()
        .add_source(range(20))
        .pipe(_triple)
        .aggregate(5)
        .add_sink(7)
        .build(queue_class=Recording, queue_size=9)
    )
    assert list(pipeline) == [[3 * x for x in range(i, i + 5)] for i in range(0, 20, 5)]
    assert [size for _, size in made] == [9, 9, 7]
    names = [name for name, _ in made]
    assert sorted(events) == sorted([("enter", n) for n in names] + [("exit", n) for n in names])


def test_stats_queue_measures_every_item_of_every_boundary():
    from torch_spdl.pipeline import QueuePerfStats, StatsQueue

    finals: dict = {}

    class Keep(StatsQueue):
        async def final_stats_callback(self, stats):
            finals[self.name] = stats

    pipeline = PipelineBuilder().add_source(range(50)).pipe(_triple, concurrency=3).add_sink(4)
    assert sorted(pipeline.build(queue_class=Keep)) == [3 * x for x in range(50)]
    assert len(finals) == 2
    for stats in finals.values():
        assert isinstance(stats, QueuePerfStats)
        assert stats.num_items == 50
        assert stats.elapsed > 0 and stats.qps == stats.num_items / stats.elapsed
        assert stats.ave_put_time >= 0 and stats.ave_get_time >= 0
        assert 0.0 <= stats.occupancy_rate <= 1.0


def test_queue_perf_stats_qps_of_an_empty_period_is_zero():
    from torch_spdl.pipeline import QueuePerfStats

    assert QueuePerfStats(0.0, 0, 0.0, 0.0, 0.0).qps == 0
    assert QueuePerfStats(2.0, 10, 0.0, 0.0, 1.0).qps == 5


def test_queue_class_must_be_an_async_queue_class():
    from torch_spdl.pipeline import StatsQueue

    builder = PipelineBuilder().add_source(range(3)).pipe(_triple)
    with pytest.raises(TypeError, match="AsyncQueue"):
        builder.build(queue_class=dict)
    with pytest.raises(TypeError, match="not an instance"):
        builder.build(queue_class=StatsQueue("q"))


@pytest.mark.parametrize("thread_output", [None, False, True])
def test_stage_id_reaches_the_hooks_and_thread_output_queue_is_accepted(thread_output):
    seen = []

    def factory(info):
        seen.append(info.stage_id)
        return []

    pipeline = (
        PipelineBuilder()
        .add_source(range(4))
        .pipe(_triple)
        .build(task_hook_factory=factory, stage_id=7, use_thread_output_queue=thread_output)
    )
    assert list(pipeline) == [0, 3, 6, 9]
    assert seen == [7]


def test_an_async_queue_is_still_an_asyncio_queue():
    import asyncio

    from torch_spdl.pipeline import AsyncQueue

    async def use():
        queue = AsyncQueue("q", buffer_size=2)
        await queue.put(1)
        async with queue.stage_hook():
            return await queue.get(), queue.maxsize, queue.name

    assert asyncio.run(use()) == (1, 2, "q")


# ---------------------------------------------------------------------------------------
# 7. add_source(continuous=True): one epoch per iteration, the pipeline kept running
# ---------------------------------------------------------------------------------------
class _Epochs:
    """A re-iterable source that counts its passes (its own epoch counter)."""

    def __init__(self, n):
        self.n = n
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        yield from range(self.n)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_a_continuous_pipeline_yields_one_epoch_per_iteration(n):
    source = _Epochs(n)
    pipeline = (
        PipelineBuilder()
        .add_source(source, continuous=True)
        .pipe(_triple, concurrency=4)
        .add_sink(3)
        .build(num_threads=4)
    )
    with pipeline.auto_stop():
        for _ in range(3):
            assert sorted(pipeline.get_iterator(timeout=WAIT)) == [3 * x for x in range(n)]
    assert source.passes == 3


@pytest.mark.parametrize("drop_last", [False, True])
def test_aggregate_closes_its_group_at_every_epoch_boundary(drop_last):
    pipeline = (
        PipelineBuilder()
        .add_source(_Epochs(5), continuous=True)
        .aggregate(3, drop_last=drop_last)
        .add_sink(3)
        .build()
    )
    expected = [[0, 1, 2]] if drop_last else [[0, 1, 2], [3, 4]]
    with pipeline.auto_stop():
        assert [list(pipeline) for _ in range(3)] == [expected] * 3


def test_a_continuous_pipeline_declared_with_defs_and_get_item_per_epoch():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import PipelineConfig, SinkConfig, SourceConfig

    config = PipelineConfig(SourceConfig(_Epochs(2), continuous=True), [], SinkConfig(2))
    pipeline = build_pipeline(config)
    with pipeline.auto_stop():
        for _ in range(2):
            assert [pipeline.get_item(timeout=WAIT) for _ in range(2)] == [0, 1]
            with pytest.raises(EOFError, match="epoch"):
                pipeline.get_item(timeout=WAIT)


def test_a_continuous_pipeline_stopped_mid_epoch_stops_and_stays_stopped():
    pipeline = PipelineBuilder().add_source(_Epochs(1000), continuous=True).build()
    with pipeline.auto_stop():
        it = pipeline.get_iterator(timeout=WAIT)
        assert [next(it), next(it)] == [0, 1]
    assert list(pipeline) == []


def test_a_continuous_pipeline_reports_a_failure_like_any_other():
    pipeline = (
        PipelineBuilder()
        .add_source(_Epochs(5), continuous=True)
        .pipe(fail_when(lambda x: x == 2))
        .build(max_failures=0)
    )
    with pytest.raises(PipelineFailure), pipeline.auto_stop():
        assert list(pipeline) == [0, 1]
    # iterated without start(): the loop raises at the end of the stream
    pipeline = (
        PipelineBuilder()
        .add_source(_Epochs(5), continuous=True)
        .pipe(fail_when(lambda x: x == 2))
        .build(max_failures=0)
    )
    got = []
    with pytest.raises(PipelineFailure):
        for x in pipeline:
            got.append(x)
    assert got == [0, 1]
    pipeline.stop()


def test_epoch_and_end_markers_are_recognised():
    from torch_spdl.pipeline import is_eof, is_epoch_end

    assert not is_eof(None) and not is_epoch_end(None) and not is_eof(0)


def test_a_continuous_pipeline_with_a_custom_aggregator_flushes_every_epoch():
    from torch_spdl.pipeline.defs import Aggregator

    class Sum(Aggregator):
        def __init__(self):
            self.total = 0

        def accumulate(self, item):
            self.total += item
            return None

        def flush(self):
            total, self.total = self.total, 0
            return total

    pipeline = PipelineBuilder().add_source(_Epochs(4), continuous=True).aggregate(Sum()).build()
    with pipeline.auto_stop():
        assert [list(pipeline) for _ in range(3)] == [[6]] * 3


# ---------------------------------------------------------------------------------------
# 5. run_pipeline_in_subprocess: one child for every iteration, the source's state kept
# ---------------------------------------------------------------------------------------
class _CountingShuffled:
    """A source with its own epoch counter: each pass is reshuffled from its number."""

    def __init__(self, n):
        self.n = n
        self.epoch = 0

    def __iter__(self):
        order = list(range(self.n))
        random.Random(self.epoch).shuffle(order)
        self.epoch += 1
        for x in order:
            yield (self.epoch, x)


def _with_pid(item):
    return (os.getpid(), *item)


def _expected_pass(n, epoch):
    order = list(range(n))
    random.Random(epoch).shuffle(order)
    return [(epoch + 1, x) for x in order]


@pytest.mark.parametrize("pool", [None, "thread", "process"])
def test_run_pipeline_in_subprocess_reuses_one_child_and_the_sources_state(pool):
    from concurrent.futures import ProcessPoolExecutor

    from torch_spdl.pipeline import run_pipeline_in_subprocess
    from torch_spdl.pipeline.defs import Pipe, PipelineConfig, SourceConfig

    executor = {
        None: None,
        "thread": ThreadPoolExecutor(max_workers=2),
        "process": ProcessPoolExecutor(max_workers=1),
    }[pool]
    try:
        config = PipelineConfig(
            SourceConfig(_CountingShuffled(6)),
            [Pipe(_with_pid, executor=executor, concurrency=2, output_order="input")],
        )
        result = run_pipeline_in_subprocess(config, buffer_size=2)
        pids = set()
        for epoch in range(3):
            got = list(result)
            pids.add(got[0][0] if pool != "process" else None)
            assert [g[1:] for g in got] == _expected_pass(6, epoch)
        if pool != "process":  # the op runs in the child itself: one pid for every pass
            assert len(pids) == 1 and pids != {os.getpid()}
        result.close()
    finally:
        if executor is not None:
            executor.shutdown()
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_an_iteration_abandoned_midway_leaves_nothing_for_the_next():
    from torch_spdl.pipeline import run_pipeline_in_subprocess
    from torch_spdl.pipeline.defs import PipelineConfig, SourceConfig

    result = run_pipeline_in_subprocess(
        PipelineConfig(SourceConfig(_CountingShuffled(50))), buffer_size=3
    )
    for item in result:
        assert item == _expected_pass(50, 0)[0]
        break
    assert list(result) == _expected_pass(50, 1)
    del result
    import gc
    import multiprocessing

    gc.collect()
    assert multiprocessing.active_children() == []


def test_a_continuous_pipeline_in_a_subprocess_yields_an_epoch_per_iteration():
    from torch_spdl.pipeline import run_pipeline_in_subprocess

    config = PipelineBuilder().add_source(_CountingShuffled(4), continuous=True).get_config()
    result = run_pipeline_in_subprocess(config, timeout=CHILD_START_S)
    assert [list(result) for _ in range(3)] == [_expected_pass(4, e) for e in range(3)]
    result.close()


def test_a_failed_run_in_the_subprocess_is_raised_and_the_next_runs_anew():
    from torch_spdl.pipeline import run_pipeline_in_subprocess

    config = PipelineBuilder().add_source(range(5)).pipe(_fail_on_three).get_config()
    result = run_pipeline_in_subprocess(config, max_failures=0)
    for _ in range(2):
        with pytest.raises(PipelineFailure) as info:
            list(result)
        assert info.group_contains(Boom)
    result.close()


def _fail_on_three(x):
    if x == 3:
        raise Boom("three")
    return x


# ---------------------------------------------------------------------------------------
# 8. more names: cache_iterator, priority executors, ProfileResult/ProfileHook, sampler
# ---------------------------------------------------------------------------------------
def test_cache_iterator_replays_the_first_items_after_a_while():
    from torch_spdl.pipeline import cache_iterator

    got = list(cache_iterator(range(100), 3, return_caches_after=5, stop_after=11))
    assert got == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2]
    assert list(itertools.islice(cache_iterator(iter(range(2)), 2), 6)) == [0, 1] * 3
    assert list(cache_iterator([], 2, stop_after=4)) == []
    with pytest.raises(ValueError, match="at least num_caches"):
        cache_iterator(range(3), 3, return_caches_after=1)


def test_a_priority_pool_starts_the_highest_priority_waiting_task_first():
    from torch_spdl.pipeline import PriorityThreadPoolExecutor

    gate = threading.Event()
    order = []
    pool = PriorityThreadPoolExecutor(max_workers=1)
    try:
        low, high = pool.get_executor(), pool.get_executor()  # made later: higher priority
        first = low.submit(gate.wait, WAIT)  # holds the only worker
        waiting = [low.submit(order.append, "low") for _ in range(2)]
        waiting.append(high.submit(order.append, "high"))
        waiting.append(pool.get_executor(priority=-5).submit(order.append, "lowest"))
        gate.set()
        assert first.result(WAIT) is True
        for future in waiting:
            future.result(WAIT)
        assert order == ["high", "low", "low", "lowest"]
    finally:
        pool.shutdown()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_priority_executors_run_pipeline_stages(kind):
    from torch_spdl.pipeline import PriorityProcessPoolExecutor, PriorityThreadPoolExecutor

    cls = PriorityThreadPoolExecutor if kind == "thread" else PriorityProcessPoolExecutor
    pool = cls(max_workers=2)
    try:
        pipeline = (
            PipelineBuilder()
            .add_source(range(20))
            .pipe(_triple, executor=pool.get_executor(), concurrency=2)
            .pipe(_triple, executor=pool.get_executor(), concurrency=2)
            .add_sink(4)
            .build()
        )
        assert sorted(pipeline) == [9 * x for x in range(20)]
        entry = pickle.loads(pickle.dumps(pool.get_executor(priority=3)))
        assert entry.priority == 3 and entry.owner is pool  # same process: the same pool
    finally:
        pool.shutdown()


def test_profile_pipeline_takes_spdls_arguments_and_returns_profile_results():
    from torch_spdl.pipeline import ProfileHook, ProfileResult, profile_pipeline
    from torch_spdl.pipeline.defs import Pipe, PipelineConfig, SourceConfig

    events = []

    class Hook(ProfileHook):
        @contextlib.contextmanager
        def stage_profile_hook(self, stage, concurrency):
            events.append(("stage", stage, concurrency))
            yield

        @contextlib.contextmanager
        def pipeline_profile_hook(self):
            events.append("begin")
            yield
            events.append("end")

    seen = []
    config = PipelineConfig(SourceConfig(range(50)), [Pipe(_triple, name="triple")])
    results = profile_pipeline(
        config, 20, callback=seen.append, hook=Hook(), concurrency_levels=(1, 2), file=None
    )
    assert len(results) == 1 and seen == list(results)
    (result,) = results
    assert isinstance(result, ProfileResult) and result.name == "1:triple"
    assert [s.concurrency for s in result.stats] == [2, 1]
    assert all(s.qps > 0 and 0.0 <= s.occupancy_rate <= 1.0 for s in result.stats)
    assert events[0] == "begin" and events[-1] == "end"
    assert sorted(e[2] for e in events[1:-1]) == [1, 2]


def test_distributed_random_sampler_takes_spdls_signature_too():
    from torch_spdl.source import DistributedRandomSampler

    ranks = [DistributedRandomSampler(9, rank=r, world_size=3) for r in range(3)]
    assert sorted(i for s in ranks for i in s) == list(range(9))
    sampler = ranks[0]
    first = list(sampler)
    assert list(sampler) == first  # no reshuffle without shuffle() / set_epoch()
    assert sampler.shuffle  # the flag reads true
    sampler.shuffle(seed=1)
    again = list(sampler)
    sampler.shuffle(seed=1)
    assert list(sampler) == again
    weighted = DistributedRandomSampler(4, rank=0, world_size=1, num_draws=50, weights=[0, 0, 1, 0])
    assert list(weighted) == [2] * 50 and len(weighted) == 50
    halves = [
        DistributedRandomSampler(10, rank=r, world_size=2, num_draws=6, weights=[1.0] * 10)
        for r in range(2)
    ]
    assert [len(list(h)) for h in halves] == [3, 3]
    assert len(list(DistributedRandomSampler(5, rank=0, world_size=1, num_draws=12))) == 12
    unshuffled = DistributedRandomSampler(4, rank=0, world_size=1, shuffle=False)
    assert not unshuffled.shuffle and list(unshuffled) == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------
# 8. Merge / MergeConfig and PathVariants / path_variants
# ---------------------------------------------------------------------------------------
def _negate(x):
    return -x


def _parity(x):
    return x % 2


async def _async_parity(x):
    return x % 2


def _defs_pipeline(items, *pipes):
    from torch_spdl.pipeline.defs import PipelineConfig, SinkConfig, SourceConfig

    return PipelineConfig(SourceConfig(items), list(pipes), SinkConfig(4))


def test_merge_gives_every_item_of_every_pipeline_then_the_outer_stages_run():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import Merge, MergeConfig, Pipe, PipelineConfig

    merged = Merge([_defs_pipeline(range(5)), _defs_pipeline(range(10, 13), Pipe(_negate))])
    assert isinstance(merged, MergeConfig)
    pipeline = build_pipeline(PipelineConfig(merged, [Pipe(_triple)]))
    assert sorted(pipeline) == sorted([3 * x for x in range(5)] + [-30, -33, -36])
    # the builder takes a Merge as its source too, and builds it again
    builder = PipelineBuilder().add_source(merged).pipe(_triple)
    assert sorted(builder.build()) == sorted(builder.build())
    with pytest.raises(ValueError, match="at least one upstream pipeline"):
        Merge([])


def test_a_custom_merge_op_reads_queues_that_end_with_eof():
    from torch_spdl.pipeline import build_pipeline, is_eof
    from torch_spdl.pipeline.defs import Merge, PipelineConfig

    async def round_robin(info, input_queues, output_queue):
        assert str(info) == "merge"
        active = list(input_queues)
        while active:
            for queue in list(active):
                item = await queue.get()
                if is_eof(item):
                    active.remove(queue)
                else:
                    await output_queue.put(item)

    config = PipelineConfig(Merge([_defs_pipeline([1, 2, 3]), _defs_pipeline([4, 5])], round_robin))
    assert list(build_pipeline(config)) == [1, 4, 2, 5, 3]

    async def first_two(name, input_queues, output_queue):  # returns early: inputs stop
        for _ in range(2):
            await output_queue.put(await input_queues[0].get())

    endless = PipelineConfig(Merge([_defs_pipeline(itertools.count())], first_two))
    assert list(build_pipeline(endless)) == [0, 1]


def test_a_failing_merged_pipeline_fails_the_outer_one_after_its_items():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import Merge, Pipe, PipelineConfig

    bad = _defs_pipeline(range(5), Pipe(fail_when(lambda x: x == 3)))
    pipeline = build_pipeline(PipelineConfig(Merge([bad])), max_failures=0)
    got = []
    with pytest.raises(PipelineFailure) as info:
        for x in pipeline:
            got.append(x)
    assert got == [0, 1, 2][: len(got)]
    assert info.group_contains(Boom, match="bad item 3")


@pytest.mark.parametrize("router", [_parity, _async_parity])
def test_path_variants_send_each_item_down_its_path_and_join(router):
    from torch_spdl.pipeline.defs import Aggregate, Disaggregate, Pipe

    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .path_variants(
            router,
            [[Pipe(_negate)], [Pipe(_triple, concurrency=2), Aggregate(2), Disaggregate()]],
        )
        .pipe(_triple)
        .add_sink(4)
        .build()
    )
    expected = [3 * -x for x in range(0, 10, 2)] + [9 * x for x in range(1, 10, 2)]
    assert sorted(pipeline) == sorted(expected)


def test_path_variants_declared_with_defs_nest_and_check_their_paths():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import PathVariants, PathVariantsConfig, Pipe, SinkConfig

    inner = PathVariants(_parity, [[Pipe(_negate)], [Pipe(_triple)]])
    outer = PathVariants(lambda x: 0 if x < 5 else 1, [[inner], [Pipe(_triple), Pipe(_triple)]])
    assert isinstance(outer, PathVariantsConfig)
    config = _defs_pipeline(range(8), outer)
    got = sorted(build_pipeline(config))
    assert got == sorted([0, -2, -4, 3, 9, 45, 54, 63])
    with pytest.raises(ValueError, match="empty"):
        PathVariants(_parity, [[Pipe(_negate)], []])
    with pytest.raises(ValueError, match="holds"):
        PathVariants(_parity, [[SinkConfig(2)]])
    with pytest.raises(ValueError, match="callable"):
        PathVariants(42, [[Pipe(_negate)]])


def test_a_router_error_or_a_bad_index_fails_the_item_alone():
    from torch_spdl.pipeline.defs import Pipe

    def router(x):
        if x == 1:
            raise Boom("no route")
        return 5 if x == 2 else 0

    pipeline = (
        PipelineBuilder()
        .add_source(range(5))
        .path_variants(router, [[Pipe(_negate)]], name="route")
        .build()
    )
    assert sorted(pipeline) == [-4, -3, 0]
    assert _stage(pipeline, "route").num_failed == 2
    strict = PipelineBuilder().add_source(range(5)).path_variants(router, [[Pipe(_negate)]])
    with pytest.raises(PipelineFailure) as info:
        list(strict.build(max_failures=0))
    assert info.group_contains(Boom, match="no route")


def test_a_failing_path_fails_the_pipeline():
    from torch_spdl.pipeline.defs import Pipe

    pipeline = (
        PipelineBuilder()
        .add_source(range(50))
        .path_variants(_parity, [[Pipe(fail_when(lambda x: x == 4))], [Pipe(_negate)]])
        .build(max_failures=0)
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert info.group_contains(Boom, match="bad item 4")


# ---------------------------------------------------------------------------------------
# 9. Execution regions: to(ProcessPoolExecutorConfig(...)) ... to(MAIN_PROCESS)
# ---------------------------------------------------------------------------------------
def _pid_tag(x):
    return (x, os.getpid())


def _no_children_left():
    import multiprocessing

    return multiprocessing.active_children() == []


def test_a_region_runs_its_stages_together_in_worker_processes():
    from torch_spdl.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

    lock = threading.Lock()  # an op holding a lock does not pickle: fork carries it

    def second(tagged):
        with lock:
            return (*tagged, os.getpid())

    pipeline = (
        PipelineBuilder()
        .add_source(range(200))
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(_pid_tag, concurrency=2)
        .pipe(second)
        .to(MAIN_PROCESS)
        .pipe(_pid_tag)
        .add_sink(8)
        .build()
    )
    got = list(pipeline)
    assert sorted(x for (x, _, _), _ in got) == list(range(200))
    for (_, first_pid, second_pid), main_pid in got:
        assert first_pid == second_pid != main_pid == os.getpid()  # fused, in a worker
    assert len({pid for (_, pid, _), _ in got}) <= 2
    region = pipeline.get_stats()[1]
    assert region.name.startswith("1:processes[2]") and region.num_in == region.num_out == 200
    assert _no_children_left()


def test_a_region_of_aggregates_and_async_ops_declared_with_defs():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import (
        MAIN_PROCESS,
        Aggregate,
        Pipe,
        PlacementConfig,
        ProcessPoolExecutorConfig,
    )

    async def twice(x):
        return 2 * x

    config = _defs_pipeline(
        range(40),
        PlacementConfig(ProcessPoolExecutorConfig(max_workers=1)),
        Pipe(twice),
        Aggregate(10),
        PlacementConfig(MAIN_PROCESS),
        Pipe(sum),
    )
    assert list(build_pipeline(config)) == [
        sum(2 * x for x in range(i, i + 10)) for i in (0, 10, 20, 30)
    ]


def test_a_failing_op_in_a_region_names_the_worker_and_the_item():
    from torch_spdl.pipeline.defs import ProcessPoolExecutorConfig

    pipeline = (
        PipelineBuilder()
        .add_source(range(100))
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(fail_when(lambda x: x == 37), name="check")
        .build(max_failures=0)
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    (error,) = info.value.exceptions
    assert isinstance(error, Boom) and str(error) == "bad item 37"
    notes = "\n".join(error.__notes__)
    assert "stage '1:check' failed on item 37" in notes and "region worker" in notes
    assert _no_children_left()


def test_failed_items_in_a_region_are_counted_within_the_limit():
    from torch_spdl.pipeline.defs import ProcessPoolExecutorConfig

    pipeline = (
        PipelineBuilder()
        .add_source(range(50))
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(fail_when(lambda x: x % 10 == 0))
        .build()
    )
    assert sorted(pipeline) == [x for x in range(50) if x % 10]
    assert pipeline.get_stats()[1].num_failed == 5


def _die_at_50(x):
    if x == 50:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_a_killed_region_worker_fails_the_pipeline_and_never_hangs():
    from torch_spdl.pipeline.defs import ProcessPoolExecutorConfig

    pipeline = (
        PipelineBuilder()
        .add_source(range(1000))
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(_die_at_50)
        .build()
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline.get_iterator(timeout=WAIT))
    (error,) = info.value.exceptions
    assert isinstance(error, RuntimeError)
    assert "region worker" in str(error) and "exited unexpectedly with code -9" in str(error)
    assert _no_children_left()


def test_leaving_a_region_pipeline_early_stops_its_workers():
    from torch_spdl.pipeline.defs import ProcessPoolExecutorConfig

    pipeline = (
        PipelineBuilder()
        .add_source(itertools.count())
        .to(ProcessPoolExecutorConfig(max_workers=2))
        .pipe(_triple)
        .build()
    )
    with pipeline.auto_stop():
        for x in pipeline:
            if x > 30:
                break
    assert _no_children_left()


def test_regions_check_their_declaration():
    from torch_spdl.pipeline.defs import (
        MAIN_PROCESS,
        InterpreterPoolExecutorConfig,
        ProcessPoolExecutorConfig,
    )

    pool = ProcessPoolExecutorConfig(max_workers=1)
    with pytest.raises(ValueError, match="no stage"):
        PipelineBuilder().add_source(range(3)).to(pool).to(MAIN_PROCESS).pipe(_triple).build()
    with pytest.raises(ValueError, match="takes no executor"):
        (
            PipelineBuilder()
            .add_source(range(3))
            .to(pool)
            .pipe(_triple, executor=ThreadPoolExecutor(1))
            .build()
        )
    with pytest.raises(TypeError, match="ProcessPoolExecutorConfig or MAIN_PROCESS"):
        PipelineBuilder().to(4)
    with pytest.raises(ValueError, match="max_workers"):
        ProcessPoolExecutorConfig(max_workers=0)
    with pytest.raises(RuntimeError, match="3.14"):
        InterpreterPoolExecutorConfig()
    # MAIN_PROCESS outside a region changes nothing; a builder with a region pickles
    plain = PipelineBuilder().add_source(range(3)).to(MAIN_PROCESS).pipe(_triple)
    assert list(plain.build()) == [0, 3, 6]
    assert pickle.loads(pickle.dumps(MAIN_PROCESS)) is MAIN_PROCESS
    builder = PipelineBuilder().add_source(range(4)).to(pool).pipe(_triple)
    assert sorted(pickle.loads(pickle.dumps(builder)).build()) == [0, 3, 6, 9]


def test_an_item_that_cannot_reach_a_region_is_named():
    from torch_spdl.pipeline.defs import ProcessPoolExecutorConfig

    pipeline = (
        PipelineBuilder()
        .add_source([1, 2, threading.Lock()])
        .to(ProcessPoolExecutorConfig(max_workers=1))
        .pipe(_pid_tag)
        .build()
    )
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    assert info.group_contains(TypeError, match="cannot be pickled to reach them")
    assert _no_children_left()


def _stall_after_three():
    yield from range(3)
    threading.Event().wait(WAIT * 3)  # a source that stalls (stopped long before this)


class _Stalling:
    def __iter__(self):
        return _stall_after_three()


def test_a_pipeline_fed_by_a_subprocess_stops_without_waiting_for_its_next_item():
    from torch_spdl.pipeline import run_pipeline_in_subprocess

    source = run_pipeline_in_subprocess(PipelineBuilder().add_source(_Stalling()).get_config())
    pipeline = PipelineBuilder().add_source(source).build()
    with pipeline.auto_stop(timeout=WAIT):  # the first item waits for the child's start
        assert [pipeline.get_item(timeout=CHILD_START_S) for _ in range(3)] == [0, 1, 2]
    # stopping ended the child, so the source thread was not left waiting for an item
    assert not [t for t in threading.enumerate() if t.name == "torch_spdl-source"]
    source.close()
    assert _no_children_left()


def test_a_continuous_pipeline_over_a_subprocess_keeps_one_child_across_epochs():
    from torch_spdl.pipeline import run_pipeline_in_subprocess

    backend = PipelineBuilder().add_source(_CountingShuffled(5)).get_config()
    source = run_pipeline_in_subprocess(backend, timeout=CHILD_START_S)
    pipeline = PipelineBuilder().add_source(source, continuous=True).build()
    with pipeline.auto_stop():
        # the first epoch's first item waits for the child's start
        epochs = [list(pipeline.get_iterator(timeout=CHILD_START_S)) for _ in range(3)]
    assert epochs == [_expected_pass(5, e) for e in range(3)]  # the child's source went on
    source.close()


async def _slowly(items):
    for item in items:
        yield item


def test_an_async_callable_object_routes_and_paths_take_async_ops():
    from torch_spdl.pipeline import build_pipeline
    from torch_spdl.pipeline.defs import PathVariants, Pipe

    class Router:
        async def __call__(self, x):
            return 0 if x < 3 else 1

    async def double(x):
        return 2 * x

    config = _defs_pipeline(
        _slowly(range(6)), PathVariants(Router(), [[Pipe(double)], [Pipe(_negate)]])
    )
    assert sorted(build_pipeline(config)) == sorted([0, 2, 4, -3, -4, -5])


# ---------------------------------------------------------------------------------------
# Issue 31: what SPDL 0.8's own tests check through its public API
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [Fraction(0), Fraction(-1, 10), Fraction(3, 2)])
def test_a_failure_rate_out_of_range_names_the_range_as_spdl_does(rate):
    builder = PipelineBuilder().add_source(range(3)).pipe(_triple).add_sink(1)
    with pytest.raises(ValueError, match=r"must be in range \(0, 1\]"):
        builder.build(max_failures=rate)
    with pytest.raises(ValueError, match=r"must be in range \(0, 1\]"):
        PipelineBuilder().add_source(range(3)).pipe(_triple, max_failures=rate)


def test_stop_before_start_and_stop_again_are_no_ops():
    pipeline = PipelineBuilder().add_source(range(4)).add_sink(1).build()
    pipeline.stop()
    pipeline.stop()
    with pipeline.auto_stop():  # still startable after a stop() that found nothing
        assert list(pipeline.get_iterator(timeout=WAIT)) == [0, 1, 2, 3]
        pipeline.stop()
        pipeline.stop()
    pipeline.stop()


class _Counting(TaskHook):
    def __init__(self):
        self.tasks = 0

    @asynccontextmanager
    async def stage_hook(self):
        yield

    @asynccontextmanager
    async def task_hook(self, input_item=None):
        self.tasks += 1
        yield


@pytest.mark.parametrize("drop_last", [False, True])
def test_aggregate_flush_at_the_end_is_one_more_hooked_task_unless_drop_last(drop_last):
    hook = _Counting()
    pipeline = (
        PipelineBuilder()
        .add_source(range(7))
        .aggregate(3, drop_last=drop_last)
        .add_sink(10)
        .build(task_hook_factory=lambda info: [hook])
    )
    batches = list(pipeline)
    assert batches == ([[0, 1, 2], [3, 4, 5]] + ([] if drop_last else [[6]]))
    assert hook.tasks == (7 if drop_last else 8)


def test_queue_class_observers_are_named_pipeline_stage_id_and_stage_from_stage_id():
    from torch_spdl.pipeline import AsyncQueue

    names: list[str] = []

    class Named(AsyncQueue):
        def __init__(self, name, *, buffer_size=1):
            names.append(str(name))
            super().__init__(name, buffer_size=buffer_size)

    pipeline = (
        PipelineBuilder()
        .add_source(range(3))
        .pipe(_triple)
        .pipe(_negate)
        .add_sink(2)
        .build(queue_class=Named, stage_id=100)
    )
    assert sorted(pipeline) == [-6, -3, 0]
    assert [n.split(":")[1:] for n in names] == [
        ["100", "src"],
        ["101", "_triple"],
        ["102", "_negate"],
    ]
    assert len({n.split(":")[0] for n in names}) == 1  # one pipeline id


def test_stage_info_takes_spdl_08_fields_and_task_stats_hook_reports_every_interval():
    import asyncio

    info = StageInfo(pipeline_id=3, stage_id="7", stage_name="decode")
    assert (info.name, info.stage_name, info.pipeline_id, str(info)) == (
        "decode",
        "decode",
        3,
        "decode",
    )
    reported: list[TaskPerfStats] = []
    second_interval = threading.Event()

    class Reporting(TaskStatsHook):
        async def interval_stats_callback(self, stats):
            reported.append(stats)
            if len(reported) == 2:
                second_interval.set()

    hook = Reporting(info, interval=0.01)

    async def run():
        async with hook.stage_hook():
            for _ in range(3):
                async with hook.task_hook():
                    pass
            assert await asyncio.to_thread(second_interval.wait, WAIT)

    asyncio.run(run())
    assert hook.num_tasks == 3
    assert sum(s.num_tasks for s in reported) == 3  # each interval reports its own tasks
    assert reported[1].num_tasks == 0


def test_each_error_of_a_failure_has_a_note_naming_its_stage():
    def failing_source():
        yield 1
        raise Boom("source broke")

    pipeline = PipelineBuilder().add_source(failing_source()).pipe(_triple).add_sink(9).build()
    with pytest.raises(PipelineFailure) as info:
        with pipeline.auto_stop():
            list(pipeline.get_iterator(timeout=WAIT))
    for error in info.value.exceptions:
        assert any(note.startswith("Pipeline stage:") for note in error.__notes__)
