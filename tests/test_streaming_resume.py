"""What a resumed or retried stream reads, counted by the loopback servers: only the bytes of
the samples not yet delivered, and a cut response continued from where it stopped."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("fsspec")

import torch_spdl  # noqa: E402
from torch_spdl.streaming import RetryPolicy, StreamingDataset  # noqa: E402
from torch_spdl.streaming.testing import LocalHTTP, write_shard  # noqa: E402

NUM_SHARDS, PER_SHARD, PAYLOAD = 6, 12, 6000
FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, timeout=120.0)


def _shard(s: int) -> bytes:
    rng = __import__("random").Random(s)
    return write_shard(
        {"__key__": f"s{s}/{i:03d}", "bin": rng.randbytes(PAYLOAD), "cls": str(s * 100 + i)}
        for i in range(PER_SHARD)
    )


SHARDS = {f"train-{s:03d}.tar": _shard(s) for s in range(NUM_SHARDS)}


def _spans(body: bytes) -> dict[str, tuple[int, int]]:
    """Each sample's byte span in a shard: from its first header to the end of its last
    file's padded data."""
    spans: dict[str, tuple[int, int]] = {}
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        for member in tar:
            key = member.name.split(".", 1)[0]
            end = member.offset_data + -(-member.size // 512) * 512
            lo, _ = spans.get(key, (member.offset, end))
            spans[key] = (lo, end)
    return spans


def _ranges(
    gets: list[tuple[str, str | None]], sizes: dict[str, int]
) -> list[tuple[str, int, int]]:
    out = []
    for path, header in gets:
        name = path.lstrip("/")
        assert header is not None and header.startswith("bytes="), header
        first, _, last = header[6:].partition("-")
        out.append((name, int(first), min(sizes[name], int(last) + 1)))
    return out


@pytest.mark.parametrize("batches", [3, 12])  # the buffers full mid-stream; draining at the end
def test_a_resume_reads_only_the_samples_not_delivered(batches: int) -> None:
    with LocalHTTP(dict(SHARDS)) as server:

        def loader() -> Any:
            ds = StreamingDataset(
                [server.url(n) for n in SHARDS], shuffle_buffer=8, seed=7, retry=FAST_RETRY
            )
            return torch_spdl.DataLoader(ds, batch_size=4, num_workers=2)

        whole = [int(c) for b in loader() for c in b["cls"]]
        first = loader()
        it = iter(first)
        head = [int(c) for _ in range(batches) for c in next(it)["cls"]]
        state = first.state_dict()
        del it
        server.faults.clear()
        resumed = loader()
        resumed.load_state_dict(state)
        tail = [int(c) for b in resumed for c in b["cls"]]
        gets = server.faults.gets(".tar")
        sent = server.faults.bytes_sent(".tar")
    assert head + tail == whole
    delivered = {(f"train-{c // 100:03d}.tar", f"s{c // 100}/{c % 100:03d}") for c in head}
    spans = {name: _spans(body) for name, body in SHARDS.items()}
    sizes = {name: len(body) for name, body in SHARDS.items()}
    for name, start, end in _ranges(gets, sizes):
        for key, (lo, hi) in spans[name].items():
            if (name, f"{key}") in delivered:
                assert hi <= start or lo >= end, f"read {name} {key} again ({start}-{end})"
    wanted = sum(
        hi - lo for n, s in spans.items() for k, (lo, hi) in s.items() if (n, k) not in delivered
    )
    # past the last sample of a shard read to its end: the end-of-archive blocks and padding
    tails = sum(sizes[n] - max(hi for _, hi in spans[n].values()) for n in SHARDS)
    assert wanted <= sent <= wanted + tails
    assert sent < sum(sizes.values()) - len(head) * PAYLOAD  # no delivered sample's bytes


def test_a_retry_continues_from_the_byte_the_cut_body_stopped_at() -> None:
    name = "train-002.tar"
    size = len(SHARDS[name])
    with LocalHTTP(dict(SHARDS)) as server:
        server.faults.plan[f"/{name}"] = ["truncate"]
        ds = StreamingDataset(
            [server.url(n) for n in SHARDS], shuffle=False, chunk_size=1 << 20, retry=FAST_RETRY
        )
        got = [int(s["cls"]) for s in ds]
        gets = [r for p, r in server.faults.gets(name)]
        sent = server.faults.bytes_sent(name)
    assert sorted(got) == sorted(s * 100 + i for s in range(NUM_SHARDS) for i in range(PER_SHARD))
    # the first request asked for the chunk, the server sent half and hung up; the retry
    # asks for the rest only
    assert gets == [f"bytes=0-{(1 << 20) - 1}", f"bytes={size // 2}-{(1 << 20) - 1}"]
    assert sent == size


@pytest.fixture(scope="module")
def s3() -> Any:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from torch_spdl.streaming.testing import LocalS3

    with LocalS3() as server:
        server.urls = [server.put("resume", n, body) for n, body in SHARDS.items()]
        yield server


def test_an_s3_retry_continues_from_the_byte_the_cut_body_stopped_at(s3: Any) -> None:
    name = "train-003.tar"
    size = len(SHARDS[name])
    s3.faults.clear()
    s3.faults.plan[f"/resume/{name}"] = ["truncate"]
    ds = StreamingDataset(
        s3.urls,
        shuffle=False,
        chunk_size=1 << 20,
        retry=FAST_RETRY,
        storage_options=s3.storage_options,
    )
    got = [int(s["cls"]) for s in ds]
    gets = [r for p, r in s3.faults.gets(name)]
    assert len(got) == NUM_SHARDS * PER_SHARD
    assert gets == [f"bytes=0-{(1 << 20) - 1}", f"bytes={size // 2}-{(1 << 20) - 1}"]
    assert s3.faults.bytes_sent(name) == size
