"""Property tests: random pipelines against a pure-Python reference model.

A drawn pipeline is a source (a list of ints, sometimes fed through an async generator) and
1-5 stages: sync function, async function, sync generator, async generator (each with a
random concurrency and output order, a value offset, and injected failures and ``None``
results for the items in a drawn residue class), ``aggregate(n, drop_last)`` and
``disaggregate()``.

The model runs the stages in input order. What the engine must match depends on order:

* every stage keeps input order (``output_order="input"`` or one worker): the output is
  exactly the model's sequence, and every stage's counters equal the model's;
* otherwise batch contents depend on arrival order, so the comparison is on what does not:
  the multiset of leaves (the ints, batches flattened), the multiset of list lengths at each
  nesting level, the number of outputs, and every stage's in/out/failed counters, plus the
  multiset of outputs (batches as tuples) when no batch was made from an out-of-order stream;
* an ``aggregate(drop_last=True)`` fed in completion order drops arrival-dependent items,
  so from there on the model keeps the partial batch and gives an upper bound instead.

Injected failures and ``None`` results apply to ints only (stages after ``aggregate`` see
lists and map over them), so which items fail never depends on arrival order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from torch_spdl.pipeline import PipelineBuilder, PipelineFailure

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# No correct pipeline in this file needs more than a fraction of a second per item, so a
# consumer that waits this long for one means the pipeline is stuck.
ITEM_TIMEOUT = 120.0

OP_KINDS = ("fn", "afn", "gen", "agen")
ASYNC_KINDS = ("afn", "agen")


class Injected(Exception):
    """The failure the test ops raise on purpose."""


# -- the drawn pipeline ------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    kind: str  # one of OP_KINDS, "agg" or "disagg"
    concurrency: int = 1
    order: str = "completion"
    add: int = 0
    copies: int = 1  # generators: how many items each input becomes
    fail: tuple[int, int] | None = None  # (m, r): raise for ints x with x % m == r
    drop: tuple[int, int] | None = None  # (m, r): produce None for ints x with x % m == r
    size: int = 0  # aggregate
    drop_last: bool = False  # aggregate

    @property
    def is_op(self) -> bool:
        return self.kind in OP_KINDS

    def workers(self, num_threads: int | None) -> int:
        """Workers the engine gives this stage: num_threads caps sync stages only."""
        if not self.is_op:
            return 1
        if self.kind not in ASYNC_KINDS and num_threads is not None:
            return min(self.concurrency, num_threads)
        return self.concurrency

    def keeps_order(self, num_threads: int | None) -> bool:
        return not self.is_op or self.order == "input" or self.workers(num_threads) == 1


@dataclass(frozen=True)
class Case:
    source: list[int]
    async_source: bool
    stages: list[Stage]
    num_threads: int | None = None
    queue_size: int | None = None
    buffer_size: int = 3


residue = st.tuples(st.integers(2, 5), st.integers(0, 4)).map(lambda t: (t[0], t[1] % t[0]))


@st.composite
def stage_lists(draw: Any, *, orders: tuple[str, ...] = ("completion", "input")) -> list[Stage]:
    stages: list[Stage] = []
    depth = 0  # how many aggregates deep the items are
    for _ in range(draw(st.integers(1, 5))):
        kinds = list(OP_KINDS)
        if depth < 2:
            kinds.append("agg")
        if depth > 0:
            kinds.append("disagg")
        kind = draw(st.sampled_from(kinds))
        if kind == "agg":
            stages.append(Stage("agg", size=draw(st.integers(1, 5)), drop_last=draw(st.booleans())))
            depth += 1
        elif kind == "disagg":
            stages.append(Stage("disagg"))
            depth -= 1
        else:
            stages.append(
                Stage(
                    kind,
                    concurrency=draw(st.integers(1, 8)),
                    order=draw(st.sampled_from(orders)),
                    add=draw(st.integers(0, 3)),
                    copies=draw(st.integers(0, 3)) if kind in ("gen", "agen") else 1,
                    fail=draw(st.none() | residue),
                    drop=draw(st.none() | residue),
                )
            )
    return stages


sources = st.lists(st.integers(0, 60), max_size=40)


# -- the ops -------------------------------------------------------------------------------


def _shift(x: Any, add: int) -> Any:
    """The ops' transformation: add to every int, mapping over (nested) batches."""
    return x + add if isinstance(x, int) else [_shift(e, add) for e in x]


def _outcome(stage: Stage, x: Any) -> str:
    """What a stage does with an input: "fail", "drop" (None result) or "keep"."""
    if isinstance(x, int):
        if stage.fail is not None and x % stage.fail[0] == stage.fail[1]:
            return "fail"
        if stage.drop is not None and x % stage.drop[0] == stage.drop[1]:
            return "drop"
    return "keep"


def _outputs(stage: Stage, x: Any) -> list[Any]:
    """The non-None outputs of a stage for an input that does not fail."""
    if _outcome(stage, x) == "drop":
        return []
    if stage.kind in ("fn", "afn"):
        return [_shift(x, stage.add)]
    return [_shift(x, stage.add + i) for i in range(stage.copies)]


def _cost(x: Any) -> None:
    # Some items take a little longer, so that concurrent workers finish out of order.
    if isinstance(x, int) and x % 5 == 0:
        time.sleep(0.0002)


def make_op(stage: Stage) -> Any:
    def check(x: Any) -> bool:
        """Raise for an item meant to fail; True for one whose result is None."""
        outcome = _outcome(stage, x)
        if outcome == "fail":
            raise Injected(f"injected failure on {x!r}")
        return outcome == "drop"

    if stage.kind == "fn":

        def fn(x: Any) -> Any:
            _cost(x)
            return None if check(x) else _shift(x, stage.add)

        return fn
    if stage.kind == "afn":

        async def afn(x: Any) -> Any:
            await asyncio.sleep(0)
            return None if check(x) else _shift(x, stage.add)

        return afn
    if stage.kind == "gen":

        def gen(x: Any) -> Any:
            _cost(x)
            dropped = check(x)
            for i in range(stage.copies):
                yield None if dropped else _shift(x, stage.add + i)

        return gen

    async def agen(x: Any) -> Any:
        dropped = check(x)
        for i in range(stage.copies):
            await asyncio.sleep(0)
            yield None if dropped else _shift(x, stage.add + i)

    return agen


async def async_source(items: list[int]) -> Any:
    for x in items:
        yield x


def build(case: Case, *, max_failures: int = -1) -> Any:
    source = async_source(case.source) if case.async_source else list(case.source)
    builder = PipelineBuilder().add_source(source)
    for i, stage in enumerate(case.stages):
        if stage.kind == "agg":
            builder.aggregate(stage.size, drop_last=stage.drop_last)
        elif stage.kind == "disagg":
            builder.disaggregate()
        else:
            builder.pipe(
                make_op(stage),
                concurrency=stage.concurrency,
                output_order=stage.order,
                name=f"s{i}",
            )
    builder.add_sink(case.buffer_size)
    return builder.build(
        num_threads=case.num_threads, queue_size=case.queue_size, max_failures=max_failures
    )


# -- the reference model ------------------------------------------------------------------


@dataclass
class Expected:
    output: list[Any]  # in input order (an upper bound when `bounded`)
    counts: list[tuple[int, int, int]]  # per stage: (num_in, num_out, num_failed)
    in_order: bool  # every stage keeps input order: compare sequences
    items_exact: bool  # no batch in the output was made from a stream out of order
    bounded: bool  # a drop_last saw arrival order: output and counts are upper bounds
    lengths_in_order: bool  # the top-level batch lengths come in the model's order
    full_batches: int | None  # every top-level item is a batch of exactly this size


def model(case: Case) -> Expected:
    stream: list[Any] = list(case.source)
    counts = []
    shuffled = bounded = False
    lengths_in_order = True
    full_batches: int | None = None
    mixed: list[bool] = []  # per aggregate level: were its batches made out of order?
    for stage in case.stages:
        num_in, failed = len(stream), 0
        if stage.kind == "agg":
            n = stage.size
            out = [stream[j : j + n] for j in range(0, len(stream), n)]
            if stage.drop_last:
                if shuffled:
                    bounded = True  # keep the partial batch: the model is now an upper bound
                elif out and len(out[-1]) < n:
                    out.pop()
            lengths_in_order = True  # one worker emits batches of n, n, ..., then the rest
            mixed.append(shuffled)
            full_batches = n if stage.drop_last else None
        elif stage.kind == "disagg":
            out = [e for batch in stream for e in batch]
            mixed.pop()
            lengths_in_order = not shuffled
            full_batches = None
        else:
            out = []
            for x in stream:
                if _outcome(stage, x) == "fail":
                    failed += 1
                else:
                    out.extend(_outputs(stage, x))
            if not stage.keeps_order(case.num_threads):
                shuffled = True
                lengths_in_order = False
        counts.append((num_in, len(out), failed))
        stream = out
    return Expected(
        stream, counts, not shuffled, not any(mixed), bounded, lengths_in_order, full_batches
    )


# -- comparing ----------------------------------------------------------------------------


def freeze(x: Any) -> Any:
    return tuple(freeze(e) for e in x) if isinstance(x, list) else x


def leaves(x: Any) -> list[int]:
    return [y for e in x for y in leaves(e)] if isinstance(x, list) else [x]


def lengths_by_level(items: list[Any]) -> dict[int, Counter[int]]:
    """For each level (1: the outputs, 2: lists inside them...), the multiset of lengths."""
    levels: dict[int, Counter[int]] = {}
    todo = [(x, 1) for x in items]
    while todo:
        x, level = todo.pop()
        if isinstance(x, list):
            levels.setdefault(level, Counter())[len(x)] += 1
            todo.extend((e, level + 1) for e in x)
    return levels


def run(case: Case, **build_kwargs: Any) -> tuple[list[Any], list[tuple[int, int, int]]]:
    pipeline = build(case, **build_kwargs)
    output = list(pipeline.get_iterator(timeout=ITEM_TIMEOUT))
    stats = pipeline.get_stats()
    assert stats[0].name == "source"
    assert stats[0].num_out == len(case.source)
    for i, (s, stage) in enumerate(zip(stats[1:], case.stages, strict=True)):
        if stage.is_op:
            assert s.name == f"{i + 1}:s{i}"
            assert s.concurrency == stage.workers(case.num_threads)
    return output, [(s.num_in, s.num_out, s.num_failed) for s in stats[1:]]


def check_against_model(case: Case, output: list[Any], counts: list[Any]) -> None:
    exp = model(case)
    frozen, exp_frozen = [freeze(x) for x in output], [freeze(x) for x in exp.output]
    got_leaves = Counter(y for x in output for y in leaves(x))
    exp_leaves = Counter(y for x in exp.output for y in leaves(x))
    if exp.full_batches is not None:
        assert all(isinstance(x, list) and len(x) == exp.full_batches for x in output)
    if exp.bounded:
        assert got_leaves <= exp_leaves
        assert len(output) <= len(exp.output)
        for got, bound in zip(counts, exp.counts, strict=True):
            assert all(g <= b for g, b in zip(got, bound, strict=True)), (got, bound)
        return
    if exp.in_order:
        assert frozen == exp_frozen
    else:
        assert got_leaves == exp_leaves
        assert len(output) == len(exp.output)
        assert lengths_by_level(output) == lengths_by_level(exp.output)
        if exp.lengths_in_order and exp.output and isinstance(exp.output[0], list):
            assert [len(x) for x in output] == [len(x) for x in exp.output]
        if exp.items_exact:
            assert Counter(frozen) == Counter(exp_frozen)
    assert counts == exp.counts


# -- the properties -----------------------------------------------------------------------


@st.composite
def cases(draw: Any) -> Case:
    return Case(
        source=draw(sources),
        async_source=draw(st.integers(0, 3)) == 0,
        stages=draw(stage_lists()),
        num_threads=draw(st.sampled_from([None, None, None, 1, 2])),
    )


@SETTINGS
@given(case=cases())
def test_random_pipeline_matches_model(case: Case) -> None:
    exp = model(case)
    event("in order" if exp.in_order else "bounded" if exp.bounded else "completion order")
    event(f"async stages: {sum(s.kind in ASYNC_KINDS for s in case.stages) > 0}")
    event(f"aggregate: {any(s.kind == 'agg' for s in case.stages)}")
    output, counts = run(case)
    check_against_model(case, output, counts)


@SETTINGS
@given(case=cases())
def test_failed_count_equals_injected_failures(case: Case) -> None:
    _, counts = run(case)
    exp = model(case)
    failed = [c[2] for c in counts]
    expected = [c[2] for c in exp.counts]
    if exp.bounded:
        assert all(f <= e for f, e in zip(failed, expected, strict=True))
    else:
        assert failed == expected
    # aggregate and disaggregate never fail
    assert all(f == 0 for f, s in zip(failed, case.stages, strict=True) if not s.is_op)


@st.composite
def small_buffer_cases(draw: Any) -> Case:
    """Every stage in input order, so the output is exactly the model's sequence."""
    return Case(
        source=draw(sources),
        async_source=draw(st.booleans()),
        stages=draw(stage_lists(orders=("input",))),
        num_threads=draw(st.sampled_from([None, 1, 2])),
        queue_size=draw(st.sampled_from([None, 1, 1, 2, 5])),  # 5: the source refills at 2
        buffer_size=draw(st.sampled_from([0, 1, 1, 2])),
    )


@SETTINGS
@given(case=small_buffer_cases())
def test_small_queues_and_threads_give_exact_output(case: Case) -> None:
    exp = model(case)
    assert exp.in_order and not exp.bounded
    output, counts = run(case)
    assert [freeze(x) for x in output] == [freeze(x) for x in exp.output]
    assert counts == exp.counts


@SETTINGS
@given(
    n=st.integers(0, 400),
    concurrency=st.integers(1, 64),
    order=st.sampled_from(["completion", "input"]),
    then_threads=st.sampled_from([0, 1, 3]),
    queue_size=st.sampled_from([None, 1, 2, 3, 6]),
    buffer_size=st.sampled_from([1, 2, 3, 6]),
)
def test_coroutines_crowding_a_channel_read_by_threads_lose_nothing(
    n: int, concurrency: int, order: str, then_threads: int, queue_size: Any, buffer_size: int
) -> None:
    """Many coroutines blocked putting into a small channel that threads read (the sink,
    or a sync stage's input): such a channel wakes its producers in bursts, and every item
    still arrives once (in input order where asked for)."""

    async def hop(x: int) -> int:
        await asyncio.sleep(0)
        return x

    def slow(x: int) -> int:
        if x % 7 == 0:
            time.sleep(0.0002)  # a cost, so that the readers fall behind now and then
        return x

    builder = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(hop, concurrency=concurrency, output_order=order)
    )
    if then_threads:
        builder.pipe(slow, concurrency=then_threads, output_order=order)
    pipeline = builder.add_sink(buffer_size).build(queue_size=queue_size)
    got = list(pipeline.get_iterator(timeout=ITEM_TIMEOUT))
    if order == "input":
        assert got == list(range(n))
    else:
        assert Counter(got) == Counter(range(n))


@SETTINGS
@given(
    items=st.lists(st.integers(0, 60), max_size=60),
    kind=st.sampled_from(OP_KINDS),
    concurrency=st.integers(2, 8),
    size=st.integers(1, 7),
    drop_last=st.booleans(),
)
def test_aggregate_after_completion_order(
    items: list[int], kind: str, concurrency: int, size: int, drop_last: bool
) -> None:
    """Batches made from a completion-ordered stream: contents vary, sizes do not."""
    stage = Stage(kind, concurrency=concurrency, order="completion")
    pipeline = (
        PipelineBuilder()
        .add_source(items)
        .pipe(make_op(stage), concurrency=concurrency)
        .aggregate(size, drop_last=drop_last)
        .add_sink(2)
        .build()
    )
    batches = list(pipeline.get_iterator(timeout=ITEM_TIMEOUT))
    n_full, rest = divmod(len(items), size)
    sizes = [size] * n_full + ([rest] if rest and not drop_last else [])
    assert [len(b) for b in batches] == sizes
    flat = Counter(x for b in batches for x in b)
    if drop_last:
        assert flat <= Counter(items)
        assert flat.total() == n_full * size
    else:
        assert flat == Counter(items)


@st.composite
def failure_cases(draw: Any) -> tuple[Case, int]:
    return Case(source=draw(sources), async_source=False, stages=draw(stage_lists())), draw(
        st.integers(0, 3)
    )


@settings(SETTINGS, max_examples=25)
@given(case_and_limit=failure_cases())
def test_max_failures_fails_exactly_when_exceeded(case_and_limit: tuple[Case, int]) -> None:
    case, limit = case_and_limit
    exp = model(case)
    failing = [  # build's max_failures counts the failures of every stage together
        f"{i + 1}:s{i}"
        for i, (stage, c) in enumerate(zip(case.stages, exp.counts, strict=True))
        if stage.is_op and c[2]
    ]
    total = sum(c[2] for stage, c in zip(case.stages, exp.counts, strict=True) if stage.is_op)
    assume(not exp.bounded)  # the model's counts are upper bounds there
    if total > limit:
        with pytest.raises(PipelineFailure) as info:
            run(case, max_failures=limit)
        assert set(info.value.stages) <= set(failing)
        assert isinstance(info.value.__cause__, Injected)
    else:
        output, counts = run(case, max_failures=limit)
        check_against_model(case, output, counts)


def _pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("torch_spdl") and t.is_alive()]


@settings(SETTINGS, max_examples=25)
@given(case=cases(), take=st.integers(0, 5))
def test_breaking_out_stops_every_thread(case: Case, take: int) -> None:
    before = set(_pipeline_threads())
    iterator = build(case).get_iterator(timeout=ITEM_TIMEOUT)
    got = []
    for item in iterator:
        got.append(item)
        if len(got) >= take:
            break
    iterator.close()  # what dropping the iterator does; here without waiting for the GC
    exp = model(case)
    if not exp.bounded:
        assert len(got) == min(take if take else 1, len(exp.output))
    assert [t for t in _pipeline_threads() if t not in before] == []


# -- a generator that fails part-way ------------------------------------------------------


def _yield_then_fail(x: int) -> Any:
    yield x
    if x % 3 == 0:
        raise Injected(f"after the first output of {x}")
    yield x + 1000


async def _ayield_then_fail(x: int) -> Any:
    yield x
    if x % 3 == 0:
        raise Injected(f"after the first output of {x}")
    yield x + 1000


@pytest.mark.parametrize("op", [_yield_then_fail, _ayield_then_fail], ids=["gen", "agen"])
def test_partial_generator_outputs_do_not_depend_on_concurrency(op: Any) -> None:
    def items(concurrency: int, order: str, num_threads: int | None = None) -> Counter[int]:
        pipeline = (
            PipelineBuilder()
            .add_source(range(12))
            .pipe(op, concurrency=concurrency, output_order=order)
            .add_sink(0)
            .build(num_threads=num_threads)
        )
        return Counter(pipeline.get_iterator(timeout=ITEM_TIMEOUT))

    reference = items(1, "completion")
    assert items(1, "input") == reference
    assert items(3, "completion") == reference
    assert items(3, "input", num_threads=1) == reference
    assert items(3, "input") == reference
