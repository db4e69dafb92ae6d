"""Mixes and elastic resume through real loaders: ``torch_spdl.DataLoader`` with worker
processes (2 of them), torch's own DataLoader taking the sampler, a ``PipelineBuilder``
source and ``StagedDataModule``. Each stops mid-epoch at one shape (ranks are loaders of
this process given their rank) and resumes at another: what was delivered and what the
resumed loaders deliver are the epoch's samples, each once."""

from __future__ import annotations

import pickle
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

import torch_spdl
from torch_spdl.pipeline import PipelineBuilder
from torch_spdl.source import (
    DistributedRandomSampler,
    MixedIterableDataset,
    MixedSampler,
    MixedStreams,
    WeightedMix,
    elastic_state,
)


class Values(Dataset):
    """Sample ``i`` is ``low + i``: every sample of every source tells where it is from."""

    def __init__(self, n: int, low: int) -> None:
        self.n, self.low = n, low

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return self.low + int(i)


def two_sets(policy: str = "cycle", **kwargs: Any) -> WeightedMix:
    """Two sources at 0.7 / 0.3, the second one too short for its weight."""
    return WeightedMix([Values(45, 0), Values(12, 1000)], [0.7, 0.3], policy=policy, **kwargs)


def epoch_of(mix: WeightedMix, epoch: int = 0) -> Counter:
    return Counter(mix[i] for i in mix.order(epoch).tolist())


def take(loader: Any, batches: int) -> tuple[list[int], dict[str, Any]]:
    """The first ``batches`` batches' samples and the rank's elastic state after them."""
    it = iter(loader)
    got = [v for _ in range(batches) for v in next(it).tolist()]
    state = elastic_state(loader)
    it.close()
    return got, state


def drain(loader: Any) -> Counter:
    return Counter(v for batch in loader for v in batch.tolist())


def test_sampler_two_ranks_resumed_on_three() -> None:
    mix = two_sets()
    delivered: Counter = Counter()
    states = []
    for rank in range(2):
        sampler = MixedSampler(mix, rank=rank, world_size=2, even_out=False)
        loader = torch_spdl.DataLoader(mix, sampler=sampler, batch_size=4, num_workers=2)
        got, state = take(loader, 3 + 2 * rank)  # the ranks stopped at different steps
        delivered.update(got)
        states.append(state)
    assert delivered.total() == 4 * (3 + 5)
    rest: Counter = Counter()
    for rank in range(3):
        sampler = MixedSampler(mix, rank=rank, world_size=3, even_out=False)
        sampler.load_state_dict(states)
        rest += drain(torch_spdl.DataLoader(mix, sampler=sampler, batch_size=4, num_workers=2))
    assert rest + delivered == epoch_of(mix)  # the whole epoch, nothing twice


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_iterable_mix_two_ranks_two_workers_resumed_on_one_rank_three_workers() -> None:
    mix = two_sets(policy="all_exhausted")
    delivered: Counter = Counter()
    states = []
    for rank in range(2):
        dataset = MixedIterableDataset(mix, rank=rank, world_size=2, batch_size=4, even_out=False)
        loader = torch_spdl.DataLoader(dataset, batch_size=4, num_workers=2)
        got, state = take(loader, 3)
        delivered.update(got)
        states.append(state)
    assert len(pickle.dumps(states)) < 4096  # a few numbers per worker
    dataset = MixedIterableDataset(mix, rank=0, world_size=1, batch_size=4, even_out=False)
    dataset.load_state_dict(states)
    rest = drain(torch_spdl.DataLoader(dataset, batch_size=4, num_workers=3))
    assert rest + delivered == epoch_of(mix) == Counter([*range(45), *range(1000, 1012)])


def test_iterable_mix_resumes_through_the_loaders_own_state_at_the_same_shape() -> None:
    """Same world size and workers: the loader hands each worker its own state back, and
    the rest of the epoch is the uninterrupted one's, batch for batch."""
    mix = two_sets()

    def loader() -> torch_spdl.DataLoader:
        dataset = MixedIterableDataset(mix, rank=1, world_size=2, batch_size=4)
        return torch_spdl.DataLoader(dataset, batch_size=4, num_workers=2)

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it).tolist() for _ in range(3)]
    state = first.state_dict()
    it.close()
    again = loader()
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == full


def test_torch_dataloader_takes_the_sampler_and_the_script_counts() -> None:
    """torch's loader counts nothing: the script says how many samples each rank took."""
    mix = two_sets(epoch_length=64)
    delivered: Counter = Counter()
    states = []
    for rank in range(2):
        sampler = MixedSampler(mix, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(mix, sampler=sampler, batch_size=4, num_workers=2)
        it = iter(loader)
        delivered.update(v for _ in range(5) for v in next(it).tolist())
        del it
        states.append(sampler.state_dict(delivered=5 * 4))
    sampler = MixedSampler(mix, rank=0, world_size=1)
    sampler.load_state_dict(states)
    rest = drain(torch.utils.data.DataLoader(mix, sampler=sampler, batch_size=4))
    assert rest + delivered == epoch_of(mix)
    with pytest.raises(TypeError, match="does not count the batches"):
        elastic_state(loader)


def test_distributed_random_sampler_through_the_loader_resumes_on_another_world() -> None:
    data = Values(50, 0)
    delivered: Counter = Counter()
    states = []
    for rank in range(3):
        sampler = DistributedRandomSampler(len(data), rank=rank, world_size=3, seed=9)
        sampler.set_epoch(2)
        loader = torch_spdl.DataLoader(data, sampler=sampler, batch_size=5, num_workers=2)
        got, state = take(loader, 2)
        delivered.update(got)
        states.append(state)
    rest: Counter = Counter()
    for rank in range(2):
        sampler = DistributedRandomSampler(len(data), rank=rank, world_size=2, seed=9)
        sampler.load_state_dict(states)
        assert sampler.epoch == 2
        rest += drain(torch_spdl.DataLoader(data, sampler=sampler, batch_size=5))
    union = rest + delivered
    assert set(union) == set(range(50))  # nothing lost
    assert (union - Counter(range(50))).total() <= 1  # 20 left for 2 ranks: no padding


def test_a_mix_as_a_pipeline_source() -> None:
    mix = two_sets()
    sampler = MixedSampler(mix, rank=0, world_size=1)
    pipeline = (
        PipelineBuilder()
        .add_source(sampler)
        .pipe(mix.__getitem__, concurrency=2, output_order="input")
        .add_sink(4)
        .build()
    )
    with pipeline.auto_stop():
        got = list(pipeline)
    assert got == [mix[i] for i in sampler.share()]
    dataset = MixedIterableDataset(mix, rank=0, world_size=1)
    pipeline = PipelineBuilder().add_source(dataset).add_sink(4).build()
    with pipeline.auto_stop():
        assert list(pipeline) == got


def test_streams_mixed_across_two_workers_each_sample_once_and_resumed() -> None:
    """Two streams (iterable mixes, dealing themselves to workers) mixed at 0.5 / 0.5
    until both are exhausted; the same shape resumes exactly, another warns."""
    a = MixedIterableDataset(WeightedMix([Values(30, 0)]), rank=0, world_size=1)
    b = MixedIterableDataset(WeightedMix([Values(14, 500)]), rank=0, world_size=1)
    streams = MixedStreams([a, b], [1.0, 1.0], seed=5, rank=0, world_size=1)
    loader = torch_spdl.DataLoader(streams, batch_size=4, num_workers=2)
    full = [batch.tolist() for batch in loader]
    assert Counter(sum(full, [])) == Counter([*range(30), *range(500, 514)])
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    it.close()
    again = torch_spdl.DataLoader(
        MixedStreams([a, b], [1.0, 1.0], seed=5, rank=0, world_size=1), batch_size=4, num_workers=2
    )
    again.load_state_dict(state)
    assert head + [batch.tolist() for batch in again] == full
    with pytest.warns(UserWarning, match="epoch starts over"):
        MixedStreams([a, b], rank=0, world_size=1).load_state_dict([state])


def test_stream_policies_in_one_process() -> None:
    def streams(policy: str) -> list[int]:
        a = MixedIterableDataset(WeightedMix([Values(20, 0)], shuffle=False), rank=0, world_size=1)
        b = MixedIterableDataset(WeightedMix([Values(5, 100)], shuffle=False), rank=0, world_size=1)
        return list(MixedStreams([a, b], [1.0, 1.0], policy=policy, rank=0, world_size=1))

    first = streams("first_exhausted")
    assert Counter(v for v in first if v >= 100) == Counter(range(100, 105))  # b ran out
    assert all(v < 20 for v in first if v < 100) and len(set(first)) == len(first)
    cycled = streams("cycle")
    assert set(cycled) == {*range(20), *range(100, 105)}  # everything at least once
    assert Counter(cycled)[100] >= 2  # the short one started over
    assert sorted(streams("all_exhausted")) == [*range(20), *range(100, 105)]


def test_staged_datamodule_trains_on_a_mix_and_resumes_on_fewer_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("lightning.pytorch")
    from torch_spdl.lightning import LightningMixedSampler, StagedDataModule

    mix = two_sets(epoch_length=64)
    delivered: Counter = Counter()
    saved = []
    for rank in range(2):  # two ranks, as Lightning's environment names them
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dm = StagedDataModule(train=mix, batch_size=4)
        loader = dm.train_dataloader()
        assert isinstance(loader.sampler, LightningMixedSampler)
        it = iter(loader)
        delivered.update(v for _ in range(3) for v in next(it).tolist())
        saved.append(dm.state_dict())
        it.close()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    checkpoint = {"train_loader": saved[0]["train_loader"],
                  "elastic": [s["elastic"][0] for s in saved]}  # fmt: skip
    dm = StagedDataModule(train=mix, batch_size=4)
    dm.load_state_dict(checkpoint)  # before the loader exists, as Lightning restores it
    loader = dm.train_dataloader()
    loader.load_state_dict(checkpoint["train_loader"])  # Lightning restores this too: set aside
    rest = drain(loader)
    assert rest + delivered == epoch_of(mix)


def test_a_stream_without_state_is_warned_about_on_resume() -> None:
    class Plain(torch.utils.data.IterableDataset):
        def set_epoch(self, epoch: int) -> None:
            pass

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(3))

    streams = MixedStreams([Plain()], rank=0, world_size=1)
    it = iter(streams)
    next(it)
    state = streams.state_dict()
    again = MixedStreams([Plain()], rank=0, world_size=1)
    again.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(again)
    assert any("has no state" in str(w.message) for w in caught)


def _shard_set(root: Any, name: str, shards: int, per_shard: int) -> list[str]:
    from torch_spdl.streaming.testing import write_shard

    paths = []
    for s in range(shards):
        samples = [{"__key__": f"{name}{s}-{i}", "cls": str(i)} for i in range(per_shard)]
        path = root / f"{name}-{s}.tar"
        path.write_bytes(write_shard(samples))
        paths.append(str(path))
    return paths


def test_streaming_datasets_mixed_at_07_03_every_key_once_and_resumed(tmp_path: Any) -> None:
    """Two shard sets streamed (``StreamingDataset``, through its public API only) and
    mixed at 0.7 / 0.3 by 2 workers: every key once; stopped after 3 batches and resumed
    through the loader's state at the same shape, the rest is exactly what was left."""
    from torch_spdl.streaming import StreamingDataset

    a = _shard_set(tmp_path, "a", 4, 6)
    b = _shard_set(tmp_path, "b", 2, 5)

    def loader() -> torch_spdl.DataLoader:
        streams = [
            StreamingDataset(urls, seed=1, shuffle_buffer=4, rank=0, world_size=1)
            for urls in (a, b)
        ]
        mix = MixedStreams(streams, [0.7, 0.3], seed=2, rank=0, world_size=1)
        return torch_spdl.DataLoader(mix, batch_size=4, num_workers=2, collate_fn=_keys)

    every = Counter(f"{n}{s}-{i}" for n, shards, k in (("a", 4, 6), ("b", 2, 5))
                    for s in range(shards) for i in range(k))  # fmt: skip
    assert Counter(k for batch in loader() for k in batch) == every
    first = loader()
    it = iter(first)
    head = [k for _ in range(3) for k in next(it)]
    state = first.state_dict()
    it.close()
    again = loader()
    again.load_state_dict(state)
    assert Counter(head) + Counter(k for batch in again for k in batch) == every


def _keys(samples: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in samples]


class Tagged(Dataset):
    """Lightning's test sample (``x``, ``idx``) with ``idx = low + i``."""

    def __init__(self, n: int, low: int) -> None:
        self.n, self.low = n, low

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        from _lightning_helpers import features

        return {"x": features(self.low + int(i)), "idx": self.low + int(i)}


def test_a_trainer_fits_on_a_mix_with_a_new_order_each_epoch() -> None:
    """Through Lightning's own loops: its set_epoch reaches the mix's sampler, and each
    epoch is that epoch's global order."""
    pl = pytest.importorskip("lightning.pytorch")
    from _lightning_helpers import Recorder

    from torch_spdl.lightning import StagedDataModule

    mix = WeightedMix([Tagged(20, 0), Tagged(8, 100)], [0.5, 0.5], policy="cycle", seed=4)
    recorder = Recorder()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(recorder, StagedDataModule(train=mix, batch_size=4, cpu_concurrency=2))
    for epoch in (0, 1):
        expected = [mix[i]["idx"] for i in mix.order(epoch).tolist()]
        assert recorder.seen["train"][epoch] == expected
    assert recorder.seen["train"][0] != recorder.seen["train"][1]
