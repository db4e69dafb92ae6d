"""Two shard sets mixed at 0.7 / 0.3 (``MixedStreams`` of two ``StreamingDataset`` s),
read by 2 ranks x 2 workers from the loopback S3 server, preempted mid-epoch and resumed at
1 rank x 3 workers from the list of both ranks' loader states: what was delivered before
and after is the whole epoch of both sets, each sample once."""

from __future__ import annotations

import pickle
import warnings
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import torch_spdl  # noqa: E402
from torch_spdl.source import MixedStreams  # noqa: E402
from torch_spdl.streaming import RetryPolicy, StreamingDataset  # noqa: E402
from torch_spdl.streaming.testing import LocalS3, write_shard  # noqa: E402

FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, timeout=120.0)
SETS = {"mix-a": (6, 10, 0), "mix-b": (3, 10, 1000)}  # name: shards, samples per shard, first value


def _shards(first: int, shards: int, per_shard: int) -> dict[str, bytes]:
    return {
        f"train-{s:03d}.tar": write_shard(
            {"__key__": f"s{s}/{i:03d}", "cls": str(first + s * 100 + i)} for i in range(per_shard)
        )
        for s in range(shards)
    }


ALL = sorted(
    first + s * 100 + i
    for shards, per_shard, first in SETS.values()
    for s in range(shards)
    for i in range(per_shard)
)


@pytest.fixture(scope="module")
def s3() -> Any:
    with LocalS3() as server:
        server.urls = {
            name: [server.put(name, key, body) for key, body in _shards(first, n, k).items()]
            for name, (n, k, first) in SETS.items()
        }
        yield server


def _mix(s3: Any, rank: int, world: int) -> MixedStreams:
    streams = [
        StreamingDataset(
            s3.urls[name],
            storage_options=s3.storage_options,
            rank=rank,
            world_size=world,
            seed=3,
            shuffle_buffer=5,
            shuffle_initial=2,
            even_out=False,
            retry=FAST_RETRY,
        )
        for name in SETS
    ]
    return MixedStreams(streams, [0.7, 0.3], seed=9, rank=rank, world_size=world)


def _values(batches: Any) -> list[int]:
    return [int(c) for batch in batches for c in batch["cls"]]


def test_a_mix_of_two_shard_sets_resumes_from_2x2_on_1x3_each_sample_once(s3: Any) -> None:
    head: list[int] = []
    states = []
    for rank in range(2):
        loader = torch_spdl.DataLoader(_mix(s3, rank, 2), batch_size=3, num_workers=2)
        it = iter(loader)
        head += _values(next(it) for _ in range(3 + rank))  # both workers have delivered
        states.append(pickle.loads(pickle.dumps(loader.state_dict())))  # as a checkpoint
        del it
    assert 0 < len(head) < len(ALL)
    mix = _mix(s3, 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mix.load_state_dict(states)
    said = [str(w.message) for w in caught]
    assert any("drawn anew" in m for m in said)  # the mix's order is given up, and said
    assert not any("starts over" in m for m in said)
    tail = _values(torch_spdl.DataLoader(mix, batch_size=3, num_workers=3))
    assert Counter(head + tail) == Counter(ALL)  # the whole epoch of both, nothing twice


def test_a_mix_resumed_at_its_saved_shape_is_exact(s3: Any) -> None:
    """1 rank x 2 workers, the list of its loader state given back at the same shape:
    what follows is what the uninterrupted run delivered after the same batches."""

    def loader(mix: MixedStreams | None = None) -> Any:
        mix = _mix(s3, 0, 1) if mix is None else mix
        return torch_spdl.DataLoader(mix, batch_size=2, num_workers=2)

    whole = [_values([b]) for b in loader()]
    first = loader()
    it = iter(first)
    head = [_values([next(it)]) for _ in range(4)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del it
    mix = _mix(s3, 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mix.load_state_dict([state])
    assert not caught
    tail = [_values([b]) for b in loader(mix)]
    # each worker's batches in its order; the fresh loader's turn between workers starts
    # at worker 0 (the loader's own state, not the mix's, holds whose turn it was)
    assert sorted(head + tail) == sorted(whole) and head == whole[:4]
    assert Counter(sum(head + tail, [])) == Counter(ALL)


def test_a_missing_rank_of_a_mix_is_an_error_not_a_loss(s3: Any) -> None:
    loader = torch_spdl.DataLoader(_mix(s3, 1, 2), batch_size=3, num_workers=2)
    it = iter(loader)
    _values(next(it) for _ in range(2))
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match=r"missing.*rank=0"):
        _mix(s3, 0, 1).load_state_dict([state])  # rank 0's state left out
