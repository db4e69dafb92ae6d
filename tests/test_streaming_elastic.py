"""A stream saved at W ranks x K workers resumed at W' x K': the rest of the epoch is
exactly the samples not delivered, each once (against a loopback HTTP server)."""

from __future__ import annotations

import pickle
import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("aiohttp")
pytest.importorskip("fsspec")

import torch_spdl  # noqa: E402
from torch_spdl.streaming import RetryPolicy, StreamingDataset  # noqa: E402
from torch_spdl.streaming.testing import LocalHTTP, write_shard  # noqa: E402

NUM_SHARDS, PER_SHARD = 7, 10
FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, timeout=120.0)
SHARDS = {
    f"train-{s:03d}.tar": write_shard(
        {"__key__": f"s{s}/{i:03d}", "cls": str(s * 100 + i)} for i in range(PER_SHARD)
    )
    for s in range(NUM_SHARDS)
}
ALL = sorted(s * 100 + i for s in range(NUM_SHARDS) for i in range(PER_SHARD))


@pytest.fixture(scope="module")
def http() -> Any:
    with LocalHTTP(dict(SHARDS)) as server:
        server.urls = [server.url(n) for n in SHARDS]
        yield server


def _dataset(http: Any, rank: int, world: int, **kwargs: Any) -> StreamingDataset:
    kwargs.setdefault("shuffle_buffer", 6)
    kwargs.setdefault("shuffle_initial", 3)
    return StreamingDataset(
        http.urls,
        rank=rank,
        world_size=world,
        seed=11,
        even_out=False,
        retry=FAST_RETRY,
        **kwargs,
    )


def _resume(states: list[Any], http: Any, rank: int, world: int, saved: int) -> Any:
    ds = _dataset(http, rank, world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds.load_state_dict(states)
    said = any("each once" in str(w.message) for w in caught)  # what is given up, said
    assert said == (saved != world)
    return ds


@settings(max_examples=12, deadline=None)
@given(
    world=st.integers(1, 3),
    new_world=st.integers(1, 3),
    stops=st.lists(st.integers(0, 40), min_size=3, max_size=3),
    twice=st.booleans(),
)
def test_a_resume_on_other_ranks_delivers_exactly_the_rest(
    http: Any, world: int, new_world: int, stops: list[int], twice: bool
) -> None:
    head: list[int] = []
    states = []
    for rank in range(world):
        ds = _dataset(http, rank, world)
        it = iter(ds)
        head += [int(next(it)["cls"]) for _ in range(min(stops[rank], len(ds.shards()) * 10))]
        states.append(pickle.loads(pickle.dumps(ds.state_dict())))  # as a checkpoint holds it
        it.close()
    tail: list[int] = []
    if twice:  # resumed, stopped again, resumed on yet another number
        again = []
        for rank in range(new_world):
            ds = _resume(states, http, rank, new_world, world)
            it = iter(ds)
            tail += [int(s["cls"]) for _, s in zip(range(stops[rank] // 2), it, strict=False)]
            again.append(pickle.loads(pickle.dumps(ds.state_dict())))
            it.close()
        states, world, new_world = again, new_world, 1 + new_world % 3
    for rank in range(new_world):
        tail += [int(s["cls"]) for s in _resume(states, http, rank, new_world, world)]
    assert sorted(head + tail) == ALL  # every sample, none twice
    assert not set(head) & set(tail)


def test_two_ranks_of_two_workers_resume_on_one_rank_of_three(http: Any) -> None:
    """As a preempted job does: every rank's loader state gathered, the run resumed with
    fewer ranks and more workers per rank."""
    head: list[int] = []
    states = []
    for rank in range(2):
        loader = torch_spdl.DataLoader(_dataset(http, rank, 2), batch_size=3, num_workers=2)
        it = iter(loader)
        head += [int(c) for _ in range(2 + rank) for c in next(it)["cls"]]
        states.append(loader.state_dict())
        del it
    ds = _resume(states, http, 0, 1, 2)
    tail = [
        int(c) for b in torch_spdl.DataLoader(ds, batch_size=3, num_workers=3) for c in b["cls"]
    ]
    assert Counter(head + tail) == Counter(ALL)


def test_a_missing_rank_is_an_error_not_a_loss(http: Any) -> None:
    ds = _dataset(http, 1, 2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()
    with pytest.raises(ValueError, match=r"missing.*rank=0"):
        _dataset(http, 0, 1).load_state_dict([state])
    other = _dataset(http, 0, 3)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="list of every rank"):
        next(iter(other))


def test_the_list_of_states_at_the_saved_shape_resumes_exactly(http: Any) -> None:
    whole, head, states = [], [], []
    for rank in range(2):
        whole.append([int(s["cls"]) for s in _dataset(http, rank, 2)])
        ds = _dataset(http, rank, 2)
        it = iter(ds)
        head.append([int(next(it)["cls"]) for _ in range(7)])
        states.append(ds.state_dict())
        it.close()
    for rank in range(2):
        ds = _resume(states, http, rank, 2, 2)
        assert head[rank] + [int(s["cls"]) for s in ds] == whole[rank]  # the same order


def _with_worker(sample: dict[str, Any]) -> dict[str, Any]:
    info = torch.utils.data.get_worker_info()
    return {"cls": sample["cls"], "w": -1 if info is None else info.id}


def _by_worker(batches: Iterable[Any]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for batch in batches:
        for c, w in zip(batch["cls"], batch["w"], strict=True):
            out.setdefault(int(w), []).append(int(c))
    return out


def test_the_loader_states_of_every_rank_resume_each_worker_exactly(http: Any) -> None:
    """2 ranks x 2 workers saved, the list of both loaders' states given to each rank's
    dataset at the same shape: every worker of every rank delivers what it would have
    uninterrupted, in its order (the fresh loader's turn between its workers may differ:
    that is the loader's state, not the stream's), and nothing says an order was lost."""

    def loader(rank: int, ds: StreamingDataset | None = None) -> Any:
        ds = _dataset(http, rank, 2, transform=_with_worker) if ds is None else ds
        return torch_spdl.DataLoader(ds, batch_size=2, num_workers=2)

    whole = [_by_worker(loader(rank)) for rank in range(2)]
    heads: list[list[Any]] = []
    states = []
    for rank in range(2):
        first = loader(rank)
        it = iter(first)
        heads.append([next(it) for _ in range(3 + rank)])
        states.append(pickle.loads(pickle.dumps(first.state_dict())))
        del it
    for rank in range(2):
        ds = _resume(states, http, rank, 2, 2)
        ds.transform = _with_worker
        again = _by_worker([*heads[rank], *loader(rank, ds)])
        assert again == whole[rank] and len(again) == 2


def test_fewer_workers_on_as_many_ranks_warn_and_deliver_the_rest_once(http: Any) -> None:
    """The same world size, another number of workers: load_state_dict cannot tell (the
    workers are not made yet), so the consumer that takes its share says what is given up
    (the saved buffers' order) when it starts; the union is still the epoch, each once."""
    first = torch_spdl.DataLoader(_dataset(http, 0, 1), batch_size=3, num_workers=2)
    it = iter(first)
    head = [int(c) for _ in range(5) for c in next(it)["cls"]]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it
    ds = _dataset(http, 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds.load_state_dict([state])
        assert not caught  # same world size: the shape is known only in the consumer
        tail = [int(s["cls"]) for s in ds]  # one consumer (no workers) instead of two
    said = [str(w.message) for w in caught if "each once" in str(w.message)]
    assert len(said) == 1 and "1 rank(s) x 2 worker(s)" in said[0]
    assert Counter(head + tail) == Counter(ALL)
