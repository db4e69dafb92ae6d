"""How soon a stream's first samples can come: what the first batch waits for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("fsspec")

from torch_spdl.streaming import RetryPolicy, StreamingDataset  # noqa: E402
from torch_spdl.streaming.testing import LocalHTTP, write_shard  # noqa: E402

NUM_SHARDS, PER_SHARD = 8, 12
SHARDS = {
    f"train-{s:03d}.tar": write_shard(
        {"__key__": f"s{s}/{i:03d}", "cls": str(s * 100 + i)} for i in range(PER_SHARD)
    )
    for s in range(NUM_SHARDS)
}


def test_the_first_samples_come_before_the_buffer_is_full() -> None:
    """A buffer larger than the epoch lets its first sample out once it holds
    ``shuffle_initial``: drawn from the first samples read, and every sample still once."""
    with LocalHTTP(dict(SHARDS)) as server:
        ds = StreamingDataset(
            [server.url(n) for n in SHARDS], shuffle_buffer=1000, shuffle_initial=6, seed=4
        )
        first_shard = int(ds.shards()[0].rsplit("-", 1)[1][:3])
        got = [int(s["cls"]) for s in ds]
    assert sorted(got) == sorted(s * 100 + i for s in range(NUM_SHARDS) for i in range(PER_SHARD))
    assert got[0] // 100 == first_shard and got[0] % 100 < 6
    assert got[:5] != sorted(got[:5])  # mixed all the same


def test_the_first_shard_is_read_alone() -> None:
    """The reads of an epoch start one at a time (slow start): while the first shard's
    answer hangs, no other shard is asked for, so it gets the bandwidth to itself."""
    with LocalHTTP(dict(SHARDS)) as server:
        urls = [server.url(n) for n in SHARDS]
        ds = StreamingDataset(
            urls, shuffle=False, retry=RetryPolicy(attempts=8, backoff=0.01, timeout=1.0)
        )
        server.faults.plan["/train-000.tar"] = ["hang"]
        assert len(list(ds)) == NUM_SHARDS * PER_SHARD
        paths = [p for p, _ in server.faults.gets(".tar")]
    first_other = next(i for i, p in enumerate(paths) if p != "/train-000.tar")
    assert first_other >= 2 and set(paths[:first_other]) == {"/train-000.tar"}


LONG = {  # shards of more samples than the pipeline's queues hold (4 + 16)
    f"long-{s:03d}.tar": write_shard(
        {"__key__": f"l{s}/{i:03d}", "cls": str(s * 100 + i)} for i in range(64)
    )
    for s in range(8)
}


def test_a_stream_reads_one_shard_ahead_of_a_slower_consumer() -> None:
    """Reads follow the consumer: while it is busy with its first sample, the stream has
    read the next shard and asks for no other (a stream that opened its reads up to
    ``read_concurrency`` had asked for the third as the second went out)."""
    names = list(LONG)
    with LocalHTTP(dict(LONG)) as server:
        server.faults.latency = 0.1  # every answer waits: reads in flight overlap
        seen: list[list[str]] = []

        def first_waits(data: bytes) -> int:
            if not seen:  # the consumer holds its first sample until shard 1 is sent
                assert server.faults.wait_sent(names[1], len(LONG[names[1]]), timeout=30)
                seen.append([p for p, _ in server.faults.gets(".tar")])
            return int(data)

        ds = StreamingDataset(
            [server.url(n) for n in names],
            shuffle=False,
            decode={"cls": first_waits},
            decode_concurrency=1,
        )
        got = [s["cls"] for s in ds]
    assert got == [s * 100 + i for s in range(8) for i in range(64)]
    assert seen == [[f"/{names[0]}", f"/{names[1]}"]]


def test_a_stream_whose_store_is_slower_reads_further_ahead() -> None:
    """Where the consumer finds its next shard still being read, more reads are kept in
    flight: with every answer late, reads overlap (they are not one after another)."""
    names = list(SHARDS)
    with LocalHTTP(dict(SHARDS)) as server:
        server.faults.latency = 0.2
        ds = StreamingDataset([server.url(n) for n in names], shuffle=False)
        assert len(list(ds)) == NUM_SHARDS * PER_SHARD
        gets = [p for p, _ in server.faults.gets(".tar")]
        overlapped = server.faults.max_in_flight
    assert sorted(gets) == [f"/{n}" for n in names]  # each once (overlapping: any order)
    assert overlapped >= 2  # a request came while an earlier one was being answered


def test_the_filesystem_is_imported_where_the_dataset_is_made() -> None:
    """Forked DataLoader workers inherit what the loader's process imported: the dataset
    imports its URLs' filesystem (and the media decoders) as it is made, so that no worker
    imports them before its first read."""
    code = (
        "import sys\n"
        "from torch_spdl.streaming import StreamingDataset\n"
        "assert 'aiohttp' not in sys.modules\n"
        "StreamingDataset('http://127.0.0.1:9/a-{0..3}.tar')\n"
        "print('aiohttp' in sys.modules, 'torch_spdl.io._load' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.split() == ["True", "True"]
