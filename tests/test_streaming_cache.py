"""The local shard cache of torch_spdl.streaming against the loopback S3 server: worker
processes of two ranks sharing one directory, a size limit, shards changed on the server."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import torch_spdl  # noqa: E402
from torch_spdl.streaming import RetryPolicy, StreamingDataset  # noqa: E402
from torch_spdl.streaming.testing import LocalS3, write_shard  # noqa: E402

NUM_SHARDS, PER_SHARD = 8, 12
FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, timeout=120.0)
ALL = sorted(s * 100 + i for s in range(NUM_SHARDS) for i in range(PER_SHARD))


def _shard(s: int, version: str = "v1") -> bytes:
    rng = random.Random(s)
    return write_shard(
        {
            "__key__": f"s{s}/{i:03d}",
            "bin": rng.randbytes(3000),
            "cls": str(s * 100 + i),
            "txt": version,
        }
        for i in range(PER_SHARD)
    )


@pytest.fixture(scope="module")
def server() -> Any:
    with LocalS3() as s3:
        s3.put("warm-up", "nothing", b"")  # its client's threads start here, not in a test
        yield s3


@pytest.fixture
def s3(server: Any, request: Any) -> Any:
    """The server, with a bucket of this test's own (a test changes its objects)."""
    bucket = request.node.name.split("[")[0].replace("_", "-")[-60:].strip("-")
    server.bucket = bucket
    server.urls = [server.put(bucket, f"train-{s:03d}.tar", _shard(s)) for s in range(8)]
    server.faults.clear()
    return server


def _loaders(s3: Any, urls: list[str], epoch: int, **kwargs: Any) -> list[Any]:
    loaders = []
    for rank in range(2):
        ds = StreamingDataset(
            urls,
            storage_options=s3.storage_options,
            rank=rank,
            world_size=2,
            seed=3,
            shuffle_buffer=6,
            retry=FAST_RETRY,
            **kwargs,
        )
        ds.set_epoch(epoch)
        loaders.append(torch_spdl.DataLoader(ds, batch_size=4, num_workers=2))
    return loaders


def _copies(cache: Path) -> dict[str, int]:
    """The cached shards by name, and their sizes: a look at a cache in use, without its
    locks, so a copy evicted between the listing and the reading is not counted (it is no
    longer held)."""
    found = {}
    for record in cache.glob("*.json"):
        try:
            meta = json.loads(record.read_text())
            size = (cache / f"{record.stem}.shard").stat().st_size
        except FileNotFoundError:  # evicted while we looked
            continue
        found[meta["url"].rsplit("/", 1)[-1]] = size
    return found


def _both_ranks(loaders: list[Any], after_each: Any = None) -> list[tuple[int, str]]:
    """Both ranks' epochs, a batch of each in turn (their workers read at the same time)."""
    its, out = [iter(loader) for loader in loaders], []
    try:
        while its:
            for it in list(its):
                try:
                    batch = next(it)
                except StopIteration:
                    its.remove(it)
                    continue
                out += [(int(c), t) for c, t in zip(batch["cls"], batch["txt"], strict=True)]
                if after_each is not None:
                    after_each()
    finally:
        # a failed check keeps this frame in its traceback: not the iterators (and workers)
        its.clear()
        it = None  # noqa: F841
    return out


def test_a_cache_at_its_limit_holds_there_and_a_changed_shard_is_read_again(
    s3: Any, tmp_path: Path
) -> None:
    size = len(_shard(0))
    limit = 5 * size  # five of the eight shards
    kwargs = {"cache_dir": tmp_path, "cache_limit": limit}
    held: list[int] = []

    def check() -> None:
        held.append(sum(_copies(tmp_path).values()))

    first = _both_ranks(_loaders(s3, s3.urls, 0, **kwargs), check)
    assert sorted(c for c, _ in first) == ALL
    for s in range(NUM_SHARDS):  # every shard downloaded once, by one consumer
        assert s3.faults.bytes_sent(f"train-{s:03d}.tar") == size
    assert max(held) <= limit
    assert sum(_copies(tmp_path).values()) == limit  # at its limit, and held there
    assert not list(tmp_path.glob("*.tmp"))

    cached = sorted(_copies(tmp_path))
    changed = cached[0]
    s = int(changed[6:9])
    s3.put(s3.bucket, changed, _shard(s, "v2"))
    s3.faults.clear()
    held.clear()
    second = _both_ranks(_loaders(s3, s3.urls, 1, **kwargs), check)
    assert sorted(c for c, _ in second) == ALL
    assert {t for c, t in second if c // 100 == s} == {"v2"}  # the new object, not the copy
    assert {t for c, t in second if c // 100 != s} == {"v1"}
    assert s3.faults.bytes_sent(changed) == len(_shard(s, "v2"))
    hits = [n for n in cached if n != changed and s3.faults.bytes_sent(n) == 0]
    assert hits  # read from disk (the others may have been evicted before their turn)
    assert max(held) <= limit and sum(_copies(tmp_path).values()) <= limit


def test_later_epochs_read_from_disk_and_a_cut_copy_is_fetched_again(
    s3: Any, tmp_path: Path
) -> None:
    kwargs = {"cache_dir": tmp_path}
    first = _both_ranks(_loaders(s3, s3.urls, 0, **kwargs))
    assert len(_copies(tmp_path)) == NUM_SHARDS
    s3.faults.clear()
    second = _both_ranks(_loaders(s3, s3.urls, 1, **kwargs))
    assert sorted(first) == sorted(second) and sorted(c for c, _ in second) == ALL
    assert not s3.faults.gets(".tar")  # only HEAD requests: every shard from disk

    copy = next(tmp_path.glob("*train-005*.shard"))
    os.truncate(copy, copy.stat().st_size // 2)  # a copy cut short (a full disk, a crash)
    third = _both_ranks(_loaders(s3, s3.urls, 2, **kwargs))
    assert sorted(c for c, _ in third) == ALL
    assert [p for p, _ in s3.faults.gets(".tar")] == [f"/{s3.bucket}/train-005.tar"]
    assert copy.stat().st_size == len(_shard(5))


def test_consumers_that_want_one_shard_at_once_download_it_once(s3: Any, tmp_path: Path) -> None:
    # one shard, four consumers (2 ranks x 2 workers): even_out gives each the same shard
    got = _both_ranks(_loaders(s3, s3.urls[:1], 0, cache_dir=tmp_path))
    assert sorted(c for c, _ in got) == sorted(4 * list(range(PER_SHARD)))
    assert s3.faults.bytes_sent("train-000.tar") == len(_shard(0))
    assert not list(tmp_path.glob("*.tmp"))
