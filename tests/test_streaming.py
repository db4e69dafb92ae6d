"""torch_spdl.streaming against real servers on 127.0.0.1 (moto's S3, an HTTP server),
with shards made here and faults injected by the servers."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import torch_spdl  # noqa: E402
from torch_spdl.streaming import (  # noqa: E402
    Consumer,
    RetryPolicy,
    ShardFailure,
    ShardReadError,
    StreamingDataset,
    expand_urls,
)
from torch_spdl.streaming.testing import LocalHTTP, LocalS3, write_shard  # noqa: E402

NUM_SHARDS, PER_SHARD = 8, 12
# The timeout is a hang guard: moto's server is pure Python, and on a slow machine one of
# its answers has taken over 5 s (four timeouts in a row failed a read). Only the "hang"
# fault needs a request to time out, and that test sets its own.
REQUEST_GUARD_S = 120.0
FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, timeout=REQUEST_GUARD_S)


def _jpeg(value: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((12, 16, 3), value, np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def _shard(s: int) -> bytes:
    return write_shard(
        {"__key__": f"s{s:02d}/{i:03d}", "cls": str(s * 100 + i), "txt": f"sample {s}-{i}"}
        for i in range(PER_SHARD)
    )


ALL = sorted(s * 100 + i for s in range(NUM_SHARDS) for i in range(PER_SHARD))
SHARDS = {f"train-{s:03d}.tar": _shard(s) for s in range(NUM_SHARDS)}


@pytest.fixture(scope="module")
def s3() -> Any:
    with LocalS3() as server:
        server.urls = [server.put("data", name, body) for name, body in SHARDS.items()]
        yield server


@pytest.fixture
def http() -> Any:
    with LocalHTTP(dict(SHARDS)) as server:
        yield server


def _dataset(s3: Any, **kwargs: Any) -> StreamingDataset:
    kwargs.setdefault("chunk_size", 2048)  # several ranged reads per shard
    kwargs.setdefault("shuffle_buffer", 10)
    kwargs.setdefault("retry", FAST_RETRY)
    return StreamingDataset(s3.urls, storage_options=s3.storage_options, **kwargs)


def _classes(loader: Any) -> list[int]:
    return [int(c) for batch in loader for c in batch["cls"]]


def test_every_sample_once_over_two_ranks_of_two_workers(s3: Any) -> None:
    seen: list[int] = []
    for rank in range(2):
        ds = _dataset(s3, rank=rank, world_size=2, seed=3)
        loader = torch_spdl.DataLoader(ds, batch_size=5, num_workers=2)
        seen += _classes(loader)
    assert sorted(seen) == ALL


def test_epochs_reshuffle_and_repeat_for_a_seed(s3: Any) -> None:
    ds = _dataset(s3, seed=1)
    first = [int(s["cls"]) for s in ds]
    again = [int(s["cls"]) for s in ds]
    ds.set_epoch(1)
    other = [int(s["cls"]) for s in ds]
    assert first == again and sorted(first) == ALL
    assert other != first and sorted(other) == ALL


def test_mid_epoch_resume_is_identical_and_rereads_no_finished_shard(s3: Any) -> None:
    def loader() -> Any:
        ds = _dataset(s3, rank=1, world_size=2, seed=7, shuffle_buffer=4)
        return torch_spdl.DataLoader(ds, batch_size=4, num_workers=2)

    whole = _classes(loader())
    first = loader()
    it = iter(first)
    head = [int(c) for _ in range(8) for c in next(it)["cls"]]
    state = first.state_dict()
    del it
    s3.faults.log.clear()
    resumed = loader()
    resumed.load_state_dict(state)
    tail = _classes(resumed)
    assert head + tail == whole
    # the shards whose every sample was delivered before the checkpoint are not read again
    delivered = Counter(c // 100 for c in head)
    finished = {s for s, n in delivered.items() if n == PER_SHARD}
    read_again = {int(path.split("-")[-1][:3]) for path, _ in s3.faults.gets(".tar")}
    assert finished and not finished & read_again


def test_the_buffer_holds_samples_undecoded(s3: Any) -> None:
    """A sample is decoded once it is drawn from the shuffle buffer: the first sample
    out of a buffer of 80 has not cost 80 decodes (the buffer holds the bytes as read)."""
    decoded: list[int] = []

    def count(data: bytes) -> int:
        decoded.append(1)  # list.append is atomic: the decode threads call this
        return int(data)

    ds = _dataset(s3, seed=2, shuffle_buffer=80, decode={"cls": count})
    it = iter(ds)
    first = next(it)
    assert isinstance(first["cls"], int) and isinstance(first["txt"], str)
    assert len(decoded) < 40  # only what was drawn (decoding a few ahead), not the buffer
    rest = [first["cls"], *(s["cls"] for s in it)]
    assert sorted(rest) == ALL and len(decoded) == len(ALL)


def test_a_sample_that_fails_to_decode_is_held_to_the_budget(s3: Any) -> None:
    def picky(data: bytes) -> int:
        value = int(data)
        if value in (105, 307):
            raise ValueError(f"bad sample {value}")
        return value

    with pytest.raises(ShardFailure, match=r"train-00[13]\.tar"):
        list(_dataset(s3, decode={"cls": picky}))
    kept = [s["cls"] for s in _dataset(s3, decode={"cls": picky}, max_failures_per_shard=1)]
    assert sorted(kept) == [c for c in ALL if c not in (105, 307)]


def test_faults_are_retried_away(s3: Any, http: Any) -> None:
    s3.faults.plan["/data/train-002.tar"] = ["503", "reset", "truncate"]
    http.faults.plan["/train-005.tar"] = ["503", "reset", "truncate", "hang"]
    from_s3 = sorted(int(s["cls"]) for s in _dataset(s3))
    ds = StreamingDataset(
        [http.url(n) for n in SHARDS],
        chunk_size=2048,
        # 4 faults; the spare attempts absorb an answer that is only slow
        retry=RetryPolicy(attempts=8, backoff=0.01, timeout=5.0),
    )
    from_http = sorted(int(s["cls"]) for s in ds)
    assert from_s3 == ALL and from_http == ALL
    assert not s3.faults.plan["/data/train-002.tar"] and not http.faults.plan["/train-005.tar"]


def test_a_fault_that_persists_is_reported_with_the_url(http: Any) -> None:
    http.faults.plan["/train-004.tar"] = ["503"] * 10
    ds = StreamingDataset([http.url(n) for n in SHARDS], retry=FAST_RETRY)
    loader = torch_spdl.DataLoader(ds, batch_size=4, num_workers=1)
    with pytest.raises(ShardReadError, match=r"train-004\.tar.*4 attempts"):
        _classes(loader)


def test_a_truncated_tar_is_held_to_the_shard_budget(http: Any) -> None:
    body = SHARDS["train-001.tar"]
    http.faults.log.clear()
    files = {"good.tar": SHARDS["train-000.tar"], "cut.tar": body[: len(body) // 2 + 100]}
    with LocalHTTP(files) as server:
        urls = [server.url("good.tar"), server.url("cut.tar")]
        with pytest.raises(ShardFailure, match=r"cut\.tar"):
            list(StreamingDataset(urls, shuffle=False, retry=FAST_RETRY))
        kept = list(StreamingDataset(urls, shuffle=False, max_failures_per_shard=1))
    assert [int(s["cls"]) for s in kept][:PER_SHARD] == list(range(PER_SHARD))
    assert 0 < len(kept) - PER_SHARD < PER_SHARD


def test_images_decode_and_pipeline_builder(http: Any) -> None:
    files = {
        f"img-{s}.tar": write_shard(
            {"__key__": f"{s}-{i}", "jpg": _jpeg(10 * i), "cls": str(i)} for i in range(6)
        )
        for s in range(2)
    }
    with LocalHTTP(files) as server:
        ds = StreamingDataset([server.url(n) for n in files], image_size=(8, 10))
        pipeline = ds.builder().aggregate(4).add_sink(4).build()
        batches = list(pipeline)
    samples = [s for b in batches for s in b]
    assert len(samples) == 12
    assert all(
        s["jpg"].shape == (3, 8, 10) and s["jpg"].dtype.is_floating_point is False for s in samples
    )
    assert sorted(s["__key__"] for s in samples)[0] == "0-0"


def test_staged_datamodule_trains_on_a_stream(s3: Any) -> None:
    import lightning.pytorch as pl
    import torch

    from torch_spdl.lightning import StagedDataModule

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[int] = []

        def training_step(self, batch: Any, _: int) -> Any:
            self.seen += [int(c) for c in batch["cls"]]
            return (self.w * batch["cls"].float()).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    dm = StagedDataModule(train=_dataset(s3), batch_size=8, cpu_concurrency=2)
    model = Model()
    trainer = pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    first, second = model.seen[: len(ALL)], model.seen[len(ALL) :]
    assert sorted(first) == ALL and sorted(second) == ALL and first != second


def test_expand_urls() -> None:
    assert expand_urls("s3://b/a-{08..10}.tar") == [f"s3://b/a-{i:02d}.tar" for i in (8, 9, 10)]
    assert expand_urls("x/{a,b}-{1..2}") == ["x/a-1", "x/a-2", "x/b-1", "x/b-2"]


@settings(max_examples=60, deadline=None)
@given(
    num_shards=st.integers(0, 40),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    epoch=st.integers(0, 5),
    drop_last=st.booleans(),
    even_out=st.booleans(),
)
def test_shard_split_has_no_duplicate_and_no_loss(
    num_shards: int, world: int, workers: int, epoch: int, drop_last: bool, even_out: bool
) -> None:
    urls = [f"file:///s/{i}.tar" for i in range(num_shards)] or ["file:///s/0.tar"]
    ds = StreamingDataset(urls, seed=5, drop_last=drop_last, even_out=even_out)
    ds.set_epoch(epoch)
    parts = [
        ds.shards(Consumer(r, world, w, workers)) for r in range(world) for w in range(workers)
    ]
    flat = [u for p in parts for u in p]
    consumers, n = world * workers, len(urls)
    if not even_out or n % consumers == 0:
        assert sorted(flat) == sorted(urls)  # exactly once
    else:
        assert len({len(p) for p in parts}) == 1  # evened out
        assert set(flat) <= set(urls)
        assert len(flat) == (n // consumers if drop_last else -(-n // consumers)) * consumers
        if not drop_last:
            assert set(flat) == set(urls)
