"""``PipelineDataset``: a pipeline as an ``IterableDataset``, sharded across DataLoader
workers and distributed ranks.

The ops are module-level functions so the dataset pickles, whatever start method the
DataLoader's workers use. Ranks are simulated with ``RANK``/``WORLD_SIZE`` (what torchrun
sets) or with explicit ``rank``/``world_size`` arguments; workers in-process by patching
``torch.utils.data.get_worker_info``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from types import SimpleNamespace
from unittest import mock

import pytest
import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spdl import PipelineDataset
from torch_spdl.pipeline import PipelineBuilder
from torch_spdl.source import DistributedRandomSampler

pytestmark = pytest.mark.timeout(600)

N = 100


def double(x: int) -> int:
    return 2 * x


async def add_one(x: int) -> int:
    return x + 1


def twice(x: int) -> Iterator[int]:
    yield x
    yield x


def gen_source(n: int) -> Iterator[int]:
    yield from range(n)


async def async_source(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


def make_builder(n: int = N) -> PipelineBuilder:
    """source -> sync op (4 threads) -> async op (4 coroutines) -> sink: items 2 * i + 1."""
    return (
        PipelineBuilder()
        .add_source(range(n))
        .pipe(double, concurrency=4)
        .pipe(add_one, concurrency=4)
        .add_sink(16)
    )


def expected(n: int = N) -> list[int]:
    return [2 * i + 1 for i in range(n)]


def default_builder() -> PipelineBuilder:
    return make_builder()


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No distributed environment leaks in from the machine running the tests."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def as_worker(worker_id: int, num_workers: int) -> AbstractContextManager[object]:
    """Make ``get_worker_info()`` answer as DataLoader worker ``worker_id`` would."""
    info = SimpleNamespace(id=worker_id, num_workers=num_workers)
    return mock.patch("torch.utils.data.get_worker_info", return_value=info)


def torch_spdl_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("torch_spdl")]


# ---------------------------------------------------------------------------------------
# in the main process
# ---------------------------------------------------------------------------------------
@pytest.mark.usefixtures("single_process")
def test_yields_exactly_the_pipelines_items() -> None:
    builder = make_builder()
    ds = PipelineDataset(builder)
    assert Counter(ds) == Counter(builder.build())
    assert sorted(ds) == expected()  # a second iteration builds a fresh pipeline


@pytest.mark.usefixtures("single_process")
def test_factory_and_build_kwargs() -> None:
    ds = PipelineDataset(default_builder, num_threads=1, max_failures=0, queue_size=2)
    assert sorted(ds) == expected()


@pytest.mark.usefixtures("single_process")
def test_keeps_the_sources_order_when_the_stages_do() -> None:
    builder = (
        PipelineBuilder().add_source(range(N)).pipe(double, concurrency=4, output_order="input")
    )
    assert list(PipelineDataset(builder)) == [2 * i for i in range(N)]


def test_rejects_what_is_not_a_builder() -> None:
    with pytest.raises(TypeError):
        PipelineDataset(range(3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a PipelineBuilder"):
        list(PipelineDataset(lambda: range(3)))  # type: ignore[arg-type,return-value]


@pytest.mark.usefixtures("single_process")
def test_breaking_out_stops_every_thread() -> None:
    ds = PipelineDataset(make_builder(10**6))
    seen = []
    for item in ds:
        seen.append(item)
        if len(seen) == 3:
            break
    assert len(seen) == 3
    assert torch_spdl_threads() == []

    it = iter(ds)
    next(it)
    assert torch_spdl_threads() != []
    it.close()  # what dropping the iterator does
    assert torch_spdl_threads() == []


# ---------------------------------------------------------------------------------------
# sharding
# ---------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 40),
    world_size=st.integers(1, 4),
    num_workers=st.integers(1, 3),
)
def test_shards_partition_the_source(n: int, world_size: int, num_workers: int) -> None:
    """Every (rank, worker) pair together read each item once; a rank reads len() items."""
    total: Counter[int] = Counter()
    for rank in range(world_size):
        ds = PipelineDataset(make_builder(n), rank=rank, world_size=world_size)
        per_rank: list[int] = []
        for worker_id in range(num_workers):
            with as_worker(worker_id, num_workers):
                per_rank.extend(ds)
        assert len(per_rank) == len(ds)
        # A rank's share does not depend on the number of workers.
        assert sorted(per_rank) == [2 * i + 1 for i in range(rank, n, world_size)]
        total.update(per_rank)
    assert total == Counter(expected(n))


@pytest.mark.usefixtures("single_process")
def test_dataloader_workers_each_item_once() -> None:
    ds = PipelineDataset(make_builder())
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    items = [int(x) for x in loader]
    assert Counter(items) == Counter(expected())


@pytest.mark.usefixtures("single_process")
def test_dataloader_with_an_async_source() -> None:
    builder = PipelineBuilder().add_source(async_source(N)).pipe(double)
    loader = torch.utils.data.DataLoader(PipelineDataset(builder), batch_size=None, num_workers=2)
    assert sorted(int(x) for x in loader) == [2 * i for i in range(N)]


@pytest.mark.usefixtures("single_process")
def test_dataloader_batches_and_len() -> None:
    ds = PipelineDataset(make_builder())
    loader = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2)
    batches = list(loader)
    assert len(loader) == len(batches) == 10  # 50 items per worker, 5 batches each
    assert sorted(torch.cat(batches).tolist()) == expected()


@pytest.mark.usefixtures("single_process")
def test_breaking_out_of_a_dataloader() -> None:
    loader = torch.utils.data.DataLoader(
        PipelineDataset(make_builder(10**6)), batch_size=None, num_workers=2
    )
    it = iter(loader)
    assert len([next(it) for _ in range(5)]) == 5
    del it  # shuts the workers down
    assert torch_spdl_threads() == []


def test_ranks_from_the_environment_cover_each_item_once(monkeypatch: pytest.MonkeyPatch) -> None:
    builder = make_builder()
    monkeypatch.setenv("WORLD_SIZE", "2")
    per_rank = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        ds = PipelineDataset(builder)
        items = list(ds)
        assert len(items) == len(ds) == N // 2
        per_rank.append(items)
    assert Counter(per_rank[0] + per_rank[1]) == Counter(expected())
    assert builder.get_config().source == range(N)  # the user's builder is untouched


def test_ranks_and_dataloader_workers_together(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 101  # odd: rank 0 gets one more
    monkeypatch.setenv("WORLD_SIZE", "2")
    total: Counter[int] = Counter()
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        ds = PipelineDataset(make_builder(n))
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        items = [int(x) for x in loader]
        assert len(items) == len(ds) == len(range(rank, n, 2))
        total.update(items)
    assert total == Counter(expected(n))


def test_a_rank_sharded_source_is_split_across_workers_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    total: Counter[int] = Counter()
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        sampler = DistributedRandomSampler(N, seed=3)
        ds = PipelineDataset(PipelineBuilder().add_source(sampler).pipe(double))
        assert len(ds) == len(sampler) == N // 2
        with as_worker(0, 2):
            items = list(ds)
        with as_worker(1, 2):
            items += list(ds)
        assert Counter(items) == Counter(2 * i for i in sampler)
        total.update(items)
    assert total == Counter(2 * i for i in range(N))


def test_shard_false_gives_every_rank_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    ds = PipelineDataset(make_builder(), shard=False)
    with as_worker(1, 2):
        assert sorted(ds) == expected()
    assert len(ds) == N


async def stalling_source(n: int) -> AsyncIterator[int]:
    """Yields ``range(n)``, then waits until cancelled (when its pipeline stops)."""
    for i in range(n):
        yield i
    await asyncio.Event().wait()


def pipeline_source_builder() -> PipelineBuilder:
    """A pipeline fed by another pipeline (a one-shot source, hence a factory)."""
    inner = PipelineBuilder().add_source(stalling_source(20)).pipe(double).add_sink(4).build()
    return PipelineBuilder().add_source(inner).pipe(add_one)


def test_a_pipeline_source_is_sharded_and_stopped() -> None:
    """The outer source thread ends up waiting on the inner pipeline, which never ends:
    stopping the outer pipeline must stop the inner one through the shard."""
    ds = PipelineDataset(pipeline_source_builder, rank=1, world_size=2)
    with as_worker(1, 2):  # shard 3 of 4: 3, 7, 11, 15, 19
        it = iter(ds)
        assert [next(it) for _ in range(5)] == [7, 15, 23, 31, 39]
        it.close()
    assert torch_spdl_threads() == []


def test_invalid_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="invalid rank"):
        list(PipelineDataset(make_builder()))
    with pytest.raises(ValueError, match="invalid rank"):
        PipelineDataset(make_builder(), rank=2, world_size=2)


# ---------------------------------------------------------------------------------------
# len()
# ---------------------------------------------------------------------------------------
@pytest.mark.usefixtures("single_process")
def test_len_known() -> None:
    assert len(PipelineDataset(make_builder(37))) == 37
    assert len(PipelineDataset(PipelineBuilder().add_source([1, 2, 3]))) == 3  # no stage
    assert len(PipelineDataset(make_builder(37), rank=2, world_size=3)) == 12
    assert len(PipelineDataset(make_builder(37), rank=2, world_size=3, shard=False)) == 37


@pytest.mark.usefixtures("single_process")
def test_len_given_wins() -> None:
    builder = PipelineBuilder().add_source(gen_source(10)).aggregate(3)
    assert len(PipelineDataset(builder, length=4)) == 4
    assert len(PipelineDataset(make_builder(), length=7)) == 7
    with pytest.raises(ValueError):
        PipelineDataset(builder, length=-1)


@pytest.mark.usefixtures("single_process")
@pytest.mark.parametrize(
    "builder",
    [
        PipelineBuilder().add_source(gen_source(10)).pipe(double),
        PipelineBuilder().add_source(async_source(10)),
        PipelineBuilder().add_source(range(10)).aggregate(3),
        PipelineBuilder().add_source(range(10)).aggregate(3).disaggregate(),
        PipelineBuilder().add_source(range(10)).pipe(twice),
    ],
    ids=["unsized source", "async source", "aggregate", "disaggregate", "generator op"],
)
def test_len_unknown(builder: PipelineBuilder) -> None:
    ds = PipelineDataset(builder)
    with pytest.raises(TypeError, match="no len"):
        len(ds)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    with pytest.raises(TypeError):
        len(loader)
