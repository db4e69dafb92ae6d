"""Bulk hand-offs between stages (the channel's notes): what a user counts on still holds.

Fast stages take every ready item at once and stage their outputs, but an output never
waits for the rest of its producer's take, a producer's items keep their order, every item
arrives exactly once, and a full pipeline holds what it held before.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time

import pytest
from _sync import WAIT
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spdl.pipeline import PipelineBuilder


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_op_that_waits_for_the_consumer_completes(kind):
    """Each item's op waits until the consumer has the previous output: were that output
    held until the end of its worker's take, the pipeline would never finish."""
    seen = threading.Semaphore(1)

    def after_previous(x: int) -> int:
        assert seen.acquire(timeout=WAIT), f"item {x}: the previous output never arrived"
        return x

    async def aafter_previous(x: int) -> int:
        while not seen.acquire(blocking=False):  # the loop must go on to hand it over
            await asyncio.sleep(0)
        return x

    n = 2_000
    op = after_previous if kind == "sync" else aafter_previous
    pipeline = PipelineBuilder().add_source(range(n)).pipe(op).add_sink(64).build()
    got = []
    for x in pipeline.get_iterator(timeout=WAIT):
        got.append(x)
        seen.release()
    assert got == list(range(n))


def test_a_source_that_waits_for_the_consumer_completes():
    """A source that yields the next key only once the consumer has the previous item (a
    feedback loop): a staged key must reach the consumer while the source waits."""
    seen = threading.Semaphore(0)

    def keys():
        for i in range(1_000):
            yield i
            assert seen.acquire(timeout=WAIT), f"key {i} never reached the consumer"

    pipeline = PipelineBuilder().add_source(keys()).pipe(lambda x: x + 1).add_sink(64).build()
    got = []
    for x in pipeline.get_iterator(timeout=WAIT):
        got.append(x)
        seen.release()
    assert got == list(range(1, 1_001))


async def _plus(x: int, k: int) -> int:
    return x + k


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 3_000),
    kinds=st.lists(st.sampled_from(["sync", "async"]), min_size=1, max_size=3),
    queue=st.sampled_from([None, 1, 2, 5, 64]),
    sink=st.integers(1, 70),
)
def test_one_worker_per_stage_keeps_order_and_loses_nothing(n, kinds, queue, sink):
    builder = PipelineBuilder().add_source(range(n))
    stages = len(kinds)
    for k, kind in enumerate(kinds):
        if kind == "sync":
            builder.pipe(lambda x, k=k: x + k)
        else:
            builder.pipe(functools.partial(_plus, k=k))
    pipeline = builder.add_sink(sink).build(queue_size=queue)
    offset = sum(range(stages))
    assert list(pipeline) == [x + offset for x in range(n)]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 3_000), workers=st.integers(2, 6), take=st.integers(0, 200))
def test_many_workers_deliver_each_item_once_and_get_item_resumes(n, workers, take):
    """Items taken from the sink in bulk and not yet handed out stay the pipeline's:
    a loop broken off and get_item() go on where it stopped."""
    pipeline = (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(lambda x: x, concurrency=workers)
        .pipe(lambda x: x, concurrency=workers)
        .add_sink(64)
        .build()
    )
    got = []
    with pipeline.auto_stop():
        for x in itertools.islice(pipeline, take):
            got.append(x)
        while True:
            try:
                got.append(pipeline.get_item(timeout=WAIT))
            except EOFError:
                break
    assert sorted(got) == list(range(n))


def test_stats_count_every_item():
    pipeline = (
        PipelineBuilder()
        .add_source(range(10_000))
        .pipe(lambda x: None if x % 3 == 0 else x, concurrency=3, name="drop")
        .add_sink(64)
        .build()
    )
    with pipeline.auto_stop():
        assert sum(1 for _ in pipeline) == 10_000 - 3_334
    stats = {s.name: s for s in pipeline.get_stats()}
    drop = next(s for name, s in stats.items() if "drop" in name)
    assert (drop.num_in, drop.num_out) == (10_000, 6_666)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_ops_that_turn_slow_and_fast_lose_nothing_and_count_failures(kind):
    """Items of a slow op move one by one, those of a fast op in takes (``pace.py``); a
    stage whose op changes speed goes from one way to the other and back, failures
    included, and every item is delivered or counted failed exactly once."""
    slow = {x for x in range(3_000) if (x // 300) % 2 == 0}  # alternating runs of 300

    def op(x: int) -> int:
        if x in slow:
            time.sleep(0.0002)  # slower than half a take: one item at a time
        if x % 97 == 0:
            raise ValueError(f"item {x}")
        return x

    async def aop(x: int) -> int:
        if x in slow:
            await asyncio.sleep(0.0002)
        if x % 97 == 0:
            raise ValueError(f"item {x}")
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(3_000))
        .pipe(op if kind == "sync" else aop, concurrency=3, name="changing")
        .add_sink(64)
        .build(max_failures=-1)
    )
    with pipeline.auto_stop():
        got = sorted(pipeline)
    failed = {x for x in range(3_000) if x % 97 == 0}
    assert got == [x for x in range(3_000) if x not in failed]
    stats = next(s for s in pipeline.get_stats() if "changing" in s.name)
    assert (stats.num_in, stats.num_out, stats.num_failed) == (3_000, 3_000 - 31, 31)
