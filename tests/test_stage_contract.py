"""The end-of-stream contract is the same for every kind of node.

A sync source, an async source, a thread stage, an async stage and an aggregate all end
the same way: what the stage still holds (aggregate's partial batch) goes out, the stage
hooks are left once per stage however many workers it runs, and the end of the stream
(with the error of a stage that failed, if one did) reaches the consumer once, after every
item made before it. Each test draws the pipeline (source kind, stage kind, concurrency,
item count, batch size, where it fails) and checks that invariant; none depends on time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_spdl.pipeline import Pipeline, PipelineBuilder, PipelineFailure, TaskHook
from torch_spdl.pipeline.defs import Aggregator

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ITEM_TIMEOUT = 120.0  # a guard against a hang, never a measure: no correct run comes close

SOURCES = ("sync", "async")
STAGES = ("none", "thread", "async")  # the op stage between the source and aggregate


class Injected(Exception):
    """The failure a test raises on purpose."""


# -- the pieces a drawn pipeline is made of -------------------------------------------------


def _sync_source(n: int, fail_at: int | None) -> Iterator[int]:
    for i in range(n):
        if i == fail_at:
            raise Injected(f"source failed at {i}")
        yield i


async def _async_source(n: int, fail_at: int | None) -> AsyncIterator[int]:
    for i in range(n):
        if i == fail_at:
            raise Injected(f"source failed at {i}")
        yield i


def _source(kind: str, n: int, fail_at: int | None = None) -> Any:
    return _sync_source(n, fail_at) if kind == "sync" else _async_source(n, fail_at)


def _thread_op(fail_at: int | None) -> Any:
    def op(x: int) -> int:
        if x == fail_at:
            raise Injected(f"thread stage failed at {x}")
        return x

    return op


def _async_op(fail_at: int | None) -> Any:
    async def op(x: int) -> int:
        if x == fail_at:
            raise Injected(f"async stage failed at {x}")
        return x

    return op


class _Batches(Aggregator):
    """``aggregate(n)`` whose ``flush()`` can fail."""

    def __init__(self, n: int, fail_flush: bool = False) -> None:
        self.n, self.fail_flush = n, fail_flush
        self._batch: list[int] = []

    def accumulate(self, item: int) -> list[int] | None:
        self._batch.append(item)
        if len(self._batch) == self.n:
            batch, self._batch = self._batch, []
            return batch
        return None

    def flush(self) -> list[int] | None:
        if self.fail_flush:
            raise Injected("aggregate failed in flush()")
        batch, self._batch = self._batch, []
        return batch or None


class _StageHooks(TaskHook):
    """Counts how often the stage hooks of one stage are entered and left."""

    def __init__(self) -> None:
        self.entered = 0
        self.exited = 0

    @asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        self.entered += 1
        try:
            yield
        finally:
            self.exited += 1

    @asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        yield


def _build(
    source: str,
    stage: str,
    n: int,
    *,
    concurrency: int = 1,
    batch: int = 3,
    fail_in: str | None = None,
    fail_at: int | None = None,
    hooks: dict[str, _StageHooks] | None = None,
) -> Pipeline[Any]:
    """source -> (a thread or async stage) -> aggregate -> sink; ``fail_in`` names the node
    that raises on item ``fail_at`` ("source", "stage", or "flush": aggregate's ``flush()``
    raises)."""
    builder = PipelineBuilder().add_source(
        _source(source, n, fail_at if fail_in == "source" else None)
    )
    op_fail = fail_at if fail_in == "stage" else None
    if stage == "thread":
        builder.pipe(_thread_op(op_fail), concurrency=concurrency, name="op")
    elif stage == "async":
        builder.pipe(_async_op(op_fail), concurrency=concurrency, name="op")
    builder.aggregate(_Batches(batch, fail_in == "flush"))

    def factory(info: Any) -> list[TaskHook]:
        assert hooks is not None
        hooks[info.name] = _StageHooks()
        return [hooks[info.name]]

    return builder.add_sink(2).build(
        max_failures=0, task_hook_factory=factory if hooks is not None else None
    )


def _consume(pipeline: Pipeline[Any]) -> tuple[list[Any], PipelineFailure | None]:
    """Every batch the consumer gets, and the failure raised at the end (if any)."""
    got: list[Any] = []
    try:
        for batch in pipeline.get_iterator(timeout=ITEM_TIMEOUT):
            got.append(batch)
    except PipelineFailure as failure:
        return got, failure
    return got, None


def _sizes(n: int, batch: int) -> list[int]:
    """The batch sizes of ``n`` items in order: full batches, then the flushed rest."""
    return [batch] * (n // batch) + ([n % batch] if n % batch else [])


def _flat(batches: Iterable[list[int]]) -> Counter[int]:
    return Counter(x for b in batches for x in b)


# -- the partial batch ----------------------------------------------------------------------


@SETTINGS
@given(
    source=st.sampled_from(SOURCES),
    stage=st.sampled_from(STAGES),
    n=st.integers(0, 40),
    batch=st.integers(1, 7),
    concurrency=st.integers(1, 6),
)
def test_the_partial_batch_is_flushed_after_every_full_one(
    source: str, stage: str, n: int, batch: int, concurrency: int
) -> None:
    pipeline = _build(source, stage, n, batch=batch, concurrency=concurrency)
    got, failure = _consume(pipeline)
    assert failure is None
    assert [len(b) for b in got] == _sizes(n, batch)
    assert _flat(got) == Counter(range(n))
    stats = {s.name: s for s in pipeline.get_stats()}
    assert stats["source"].num_out == n
    (aggregate,) = (s for name, s in stats.items() if "aggregate" in name)
    assert aggregate.num_out == len(got)  # the flushed batch is counted like the others


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("source", SOURCES)
def test_an_empty_stream_ends_with_nothing_flushed(source: str, stage: str) -> None:
    pipeline = _build(source, stage, 0, concurrency=4)
    with pipeline.auto_stop():
        with pytest.raises(EOFError):
            pipeline.get_item(timeout=ITEM_TIMEOUT)
        with pytest.raises(EOFError):  # the end is the end: asking again changes nothing
            pipeline.get_item(timeout=ITEM_TIMEOUT)


# -- a failing node -------------------------------------------------------------------------


@st.composite
def _failures(draw: Any) -> tuple[str, str, str, int, int, int]:
    source = draw(st.sampled_from(SOURCES))
    stage = draw(st.sampled_from(STAGES))
    # (an aggregator that raises on an item drops it: aggregate has no failure budget)
    places = ["source", "flush"] + (["stage"] if stage != "none" else [])
    fail_in = draw(st.sampled_from(places))
    n = draw(st.integers(1, 30))
    fail_at = draw(st.integers(0, n - 1))
    batch = draw(st.integers(1, 5))
    return source, stage, fail_in, n, fail_at, batch


@SETTINGS
@given(case=_failures())
def test_a_failure_reaches_the_consumer_once_after_the_items_before_it(
    case: tuple[str, str, str, int, int, int],
) -> None:
    source, stage, fail_in, n, fail_at, batch = case
    # One worker per stage: "the items before it" are then exactly the items before
    # ``fail_at`` (with more, a failing stage still finishes what its other workers hold).
    pipeline = _build(source, stage, n, batch=batch, fail_in=fail_in, fail_at=fail_at)
    got, failure = _consume(pipeline)
    assert failure is not None
    assert len(failure.exceptions) == 1  # once, whatever the stages after it passed on
    assert isinstance(failure.__cause__, Injected)
    made = n if fail_in == "flush" else fail_at  # what the stream held before the failure
    if fail_in == "flush":  # the full batches went out; the flush itself failed
        assert [len(b) for b in got] == [batch] * (n // batch)
        assert _flat(got) <= Counter(range(n))
    else:  # every item made before it, and the partial batch, before the error
        assert [len(b) for b in got] == _sizes(made, batch)
        assert _flat(got) == Counter(range(made))
    expected_stage = {"source": "source", "stage": "op", "flush": "aggregate"}[fail_in]
    assert expected_stage in failure.stages[0]


@pytest.mark.parametrize("stage", ["thread", "async"])
def test_a_failing_stage_with_many_workers_ends_once(stage: str) -> None:
    got, failure = _consume(
        _build("sync", stage, 50, concurrency=8, fail_in="stage", fail_at=25, batch=4)
    )
    assert failure is not None and len(failure.exceptions) == 1
    assert isinstance(failure.__cause__, Injected)
    items = _flat(got)
    assert 25 not in items and items <= Counter(range(50))
    assert all(len(b) == 4 for b in got[:-1])  # only the flushed batch may be short


# -- stage hooks ----------------------------------------------------------------------------


@SETTINGS
@given(
    source=st.sampled_from(SOURCES),
    stage=st.sampled_from(["thread", "async"]),
    n=st.integers(0, 30),
    concurrency=st.integers(1, 8),
    fail_in=st.sampled_from([None, "source", "stage", "flush"]),
)
def test_stage_hooks_are_left_exactly_once_per_stage(
    source: str, stage: str, n: int, concurrency: int, fail_in: str | None
) -> None:
    hooks: dict[str, _StageHooks] = {}
    pipeline = _build(
        source,
        stage,
        n,
        concurrency=concurrency,
        fail_in=fail_in,
        fail_at=n // 2 if fail_in is not None else None,
        hooks=hooks,
    )
    _consume(pipeline)
    assert len(hooks) == 2  # the op stage and aggregate
    assert [(h.entered, h.exited) for h in hooks.values()] == [(1, 1), (1, 1)]


# -- the end of the stream, once ------------------------------------------------------------


@SETTINGS
@given(
    source=st.sampled_from(SOURCES),
    stage=st.sampled_from(["thread", "async"]),
    n=st.integers(0, 60),
    concurrency=st.integers(1, 8),
    ordered=st.booleans(),
)
def test_the_stream_ends_once_after_every_worker_left(
    source: str, stage: str, n: int, concurrency: int, ordered: bool
) -> None:
    """Only the last worker of a stage closes its output: none of the items the others
    still hold is lost, and the consumer sees the end once."""
    builder = PipelineBuilder().add_source(_source(source, n))
    op = _thread_op(None) if stage == "thread" else _async_op(None)
    order = "input" if ordered else "completion"
    builder.pipe(op, concurrency=concurrency, output_order=order, name="a")
    builder.pipe(op, concurrency=concurrency, output_order=order, name="b")
    pipeline = builder.add_sink(2).build()
    got = []
    with pipeline.auto_stop():
        while True:
            try:
                got.append(pipeline.get_item(timeout=ITEM_TIMEOUT))
            except EOFError:
                break
        with pytest.raises(EOFError):
            pipeline.get_item(timeout=ITEM_TIMEOUT)
    if ordered:
        assert got == list(range(n))
    else:
        assert Counter(got) == Counter(range(n))
    assert [s.num_out for s in pipeline.get_stats()] == [n, n, n]


# -- failures in aggregate and disaggregate count like any stage's -------------------------


class _RejectsOdd(Aggregator):
    """Pairs of even items; an odd item makes ``accumulate`` raise."""

    def __init__(self) -> None:
        self._held: list[int] = []

    def accumulate(self, item: int) -> list[int] | None:
        if item % 2:
            raise Injected(f"odd item {item}")
        self._held.append(item)
        if len(self._held) == 2:
            pair, self._held = self._held, []
            return pair
        return None

    def flush(self) -> list[int] | None:
        pair, self._held = self._held, []
        return pair or None


@pytest.mark.parametrize("max_failures", [-1, 0, 2])
def test_an_aggregator_that_raises_counts_against_max_failures(max_failures: int) -> None:
    pipeline = (
        PipelineBuilder()
        .add_source(range(10))
        .aggregate(_RejectsOdd())  # type: ignore[arg-type]
        .add_sink(4)
        .build(num_threads=1, max_failures=max_failures)
    )
    got, failure = _consume(pipeline)
    if max_failures < 0:  # no limit: the five odd items are logged and dropped, no more
        assert failure is None
        assert _flat(got) == Counter(range(0, 10, 2))
        return
    assert failure is not None and "aggregate" in failure.stages[0]
    assert isinstance(failure.__cause__, Injected)
    assert _flat(got) <= Counter(range(0, 10, 2))


def test_disaggregate_of_a_non_iterable_counts_as_a_failure() -> None:
    pipeline = (
        PipelineBuilder()
        .add_source([[1, 2], 3, [4]])
        .disaggregate()
        .add_sink(4)
        .build(num_threads=1, max_failures=0)
    )
    got, failure = _consume(pipeline)
    assert failure is not None and "disaggregate" in failure.stages[0]
    assert isinstance(failure.__cause__, TypeError)
    assert _flat([got]) <= Counter([1, 2, 4])


# -- an op that cannot be called: one behaviour for thread and async stages ----------------
def _sync_two_args(x: int, y: int) -> int:
    return x + y


def _sync_two_args_gen(x: int, y: int) -> Iterator[int]:
    yield x + y


async def _async_two_args(x: int, y: int) -> int:
    return x + y


def _type_error_inside(x: int) -> int:
    if x % 2:
        raise TypeError(f"odd item {x}")
    return x


@pytest.mark.parametrize("op", [_sync_two_args, _sync_two_args_gen, _async_two_args])
@pytest.mark.parametrize("order", ["completion", "input"])
@pytest.mark.parametrize("executor", [False, True])
def test_an_op_that_cannot_be_called_fails_its_stage_thread_or_async(
    op: Any, order: str, executor: bool
) -> None:
    if executor and op is _async_two_args:
        pytest.skip("an async op takes no executor")
    with ThreadPoolExecutor(2) as pool:
        pipeline = (
            PipelineBuilder()
            .add_source(range(10))
            .pipe(
                op,
                name="wrong",
                concurrency=2,
                output_order=order,
                executor=pool if executor else None,
            )
            .add_sink(0)
            .build()  # no max_failures: it is not an item's failure
        )
        with pytest.raises(PipelineFailure) as info:
            list(pipeline.get_iterator(timeout=ITEM_TIMEOUT))
    assert info.value.stage == "1:wrong"
    error = info.value.__cause__
    assert isinstance(error, TypeError)
    assert any("exactly one argument" in note for note in error.__notes__)


def test_a_type_error_inside_the_op_is_the_items_failure() -> None:
    pipeline = PipelineBuilder().add_source(range(10)).pipe(_type_error_inside).add_sink(0).build()
    assert list(pipeline.get_iterator(timeout=ITEM_TIMEOUT)) == [0, 2, 4, 6, 8]
    assert pipeline.get_stats()[1].num_failed == 5  # [0] is the source
