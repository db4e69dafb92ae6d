"""Stream WebDataset shards from S3 into training batches, and resume mid-epoch.

    .venv/bin/python examples/streaming_s3.py --quick
    .venv/bin/python examples/streaming_s3.py --url 's3://bucket/train-{0000..0099}.tar'

With ``--quick`` (or no ``--url``) it starts a local S3 server (moto, on 127.0.0.1, with
20 ms added to every request and a few injected faults: a 503, a reset connection, a body
cut short) and writes shards of JPEG + class samples to it. Then it reads one epoch with
``torch_spdl.DataLoader`` over ``StreamingDataset`` (2 worker processes, images decoded to
64x64), saves the loader's state halfway through a second epoch, resumes it in a fresh
loader, and checks its own result: every sample exactly once per epoch, and the resumed
epoch identical to the uninterrupted one. It exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from typing import Any

import numpy as np

import torch_spdl
from torch_spdl.streaming import StreamingDataset


def make_shards(s3: Any, shards: int, per_shard: int) -> list[str]:
    from PIL import Image

    from torch_spdl.streaming.testing import write_shard

    rng = np.random.default_rng(0)
    urls = []
    for s in range(shards):
        samples = []
        for i in range(per_shard):
            pixels = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
            jpeg = io.BytesIO()
            Image.fromarray(pixels).save(jpeg, format="JPEG")
            samples.append({"__key__": f"{s:04d}/{i:04d}", "jpg": jpeg.getvalue(), "cls": str(i)})
        urls.append(s3.put("examples", f"train-{s:04d}.tar", write_shard(samples)))
    return urls


def keys_of(batches: Any, limit: int | None = None) -> list[str]:
    keys: list[str] = []
    for n, batch in enumerate(batches):
        assert batch["jpg"].shape[1:] == (3, 64, 64), batch["jpg"].shape
        keys += batch["__key__"]
        if limit is not None and n + 1 == limit:
            break
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small local data set")
    parser.add_argument("--url", default=None, help="shards to read instead of a local server")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    def loader_for(urls: list[str], options: dict[str, Any], epoch: int) -> Any:
        ds = StreamingDataset(urls, image_size=(64, 64), storage_options=options, seed=0)
        ds.set_epoch(epoch)
        return torch_spdl.DataLoader(ds, batch_size=args.batch, num_workers=args.workers)

    if args.url is not None:
        loader = loader_for([args.url], {}, 0)
        t0 = time.perf_counter()
        n = len(keys_of(loader))
        print(f"{n} samples in {time.perf_counter() - t0:.1f} s")
        return 0

    from torch_spdl.streaming.testing import LocalS3

    shards, per_shard = (8, 24) if args.quick else (32, 128)
    with LocalS3() as s3:
        urls = make_shards(s3, shards, per_shard)
        s3.faults.latency = 0.02
        s3.faults.plan[urls[1].removeprefix("s3:/")] = ["503", "reset", "truncate"]
        options = s3.storage_options
        print(f"{shards} shards x {per_shard} samples on {s3.endpoint} (20 ms per request)")

        t0 = time.perf_counter()
        first = keys_of(loader_for(urls, options, epoch=0))
        elapsed = time.perf_counter() - t0
        print(f"epoch 0: {len(first)} samples in {elapsed:.2f} s, the injected faults retried")

        whole = keys_of(loader_for(urls, options, epoch=1))
        half = len(whole) // args.batch // 2
        interrupted = loader_for(urls, options, epoch=1)
        epoch = iter(interrupted)  # the epoch in progress, as in a training loop
        head = keys_of(epoch, limit=half)
        state = interrupted.state_dict()  # what a checkpoint saves, mid-epoch
        del epoch, interrupted
        resumed = loader_for(urls, options, epoch=1)
        resumed.load_state_dict(state)
        tail = keys_of(resumed)
        print(f"epoch 1: stopped after {len(head)} samples, resumed for {len(tail)} more")

    expected = sorted(f"{s:04d}/{i:04d}" for s in range(shards) for i in range(per_shard))
    problems = []
    if sorted(first) != expected:
        problems.append("epoch 0 did not deliver every sample exactly once")
    if sorted(whole) != expected:
        problems.append("epoch 1 did not deliver every sample exactly once")
    if first == whole:
        problems.append("epoch 1 was not reshuffled")
    if head + tail != whole:
        problems.append("the resumed epoch differs from the uninterrupted one")
    for p in problems:
        print("FAILED:", p)
    if problems:
        return 1
    print("every sample once per epoch, resumed epoch identical: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
