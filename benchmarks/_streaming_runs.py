"""The pieces of ``streaming.py``: the servers and the shards, and one measured run.

The server process makes the JPEG shards once and serves them three ways, each with the
same latency added to every request: moto's S3 and a plain HTTP server (``Range`` and
ETags, the standard library's) on 127.0.0.1, and files in a local directory. For litdata
it also writes the same samples in litdata's own format (``litdata.optimize``, one chunk
per shard's worth of bytes) and puts them on the S3 server.

A run is one loader, one transport, one or two epochs, in a fresh process (the caller's);
it measures each epoch: samples, seconds, the time to the first batch (from the loader's
construction, imports excluded), the CPU of the process tree and the consumer's share of
it, the CPU the rest of the machine used meanwhile, and for torch_spdl the size of one
worker's resumable state taken mid-epoch.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IMPLS = ("torch_spdl", "webdataset", "litdata")


def _jpeg(rng: Any, width: int, height: int) -> bytes:
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    base = (x * rng.integers(1, 4) + y * rng.integers(1, 4)) % 256
    pixels = np.stack([base, base[::-1], (base + rng.integers(0, 255)) % 256], axis=-1)
    pixels = (pixels + rng.integers(0, 24, pixels.shape)).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def _litdata_item(sample: tuple[bytes, int]) -> dict[str, Any]:
    from litdata.types import Jpeg

    return {"jpg": Jpeg(bytes=sample[0]), "cls": sample[1]}


def _litdata_to_s3(samples: list[tuple[bytes, int]], shard_bytes: int, s3: Any) -> str | None:
    """The samples in litdata's format on the S3 server (None: litdata is not installed)."""
    try:
        import litdata
    except ImportError:
        return None
    out = tempfile.mkdtemp(prefix="torch_spdl_bench_litdata_")
    litdata.optimize(
        fn=_litdata_item,
        inputs=samples,
        output_dir=out,
        chunk_bytes=shard_bytes,
        num_workers=1,
        start_method="fork",
        verbose=False,
    )
    for name in sorted(os.listdir(out)):
        s3.put("bench", f"litdata/{name}", Path(out, name).read_bytes())
    return "s3://bench/litdata"


def serve(shards: int, per_shard: int, width: int, height: int, latency: float) -> None:
    """Make the shards, start the servers, print where everything is, wait for stdin."""
    import numpy as np

    from torch_spdl.streaming.testing import Faults, LocalHTTP, LocalS3, write_shard

    rng = np.random.default_rng(0)
    local = Path(tempfile.mkdtemp(prefix="torch_spdl_bench_shards_"))
    files: dict[str, bytes] = {}
    samples: list[tuple[bytes, int]] = []
    with LocalS3() as s3, LocalHTTP(files, Faults()) as http:
        urls = []
        for s in range(shards):
            rows = [(_jpeg(rng, width, height), i % 10) for i in range(per_shard)]
            samples += rows
            body = write_shard(
                {"__key__": f"{s:04d}/{i:05d}", "jpg": jpg, "cls": str(c)}
                for i, (jpg, c) in enumerate(rows)
            )
            name = f"train-{s:04d}.tar"
            files[name] = body
            (local / name).write_bytes(body)
            urls.append(s3.put("bench", name, body))
        total = sum(len(b) for b in files.values())
        litdata_dir = _litdata_to_s3(samples, total // shards, s3)
        s3.faults.latency = http.faults.latency = latency
        setup = {
            "options": s3.storage_options,
            "s3": urls,
            "http": [http.url(n) for n in files],
            "local": [str(local / n) for n in files],
            "litdata": litdata_dir,
            "bytes": total,
        }
        print(json.dumps(setup), flush=True)
        sys.stdin.read()  # until the parent closes our stdin
    for path in local.iterdir():
        path.unlink()
    local.rmdir()


# -- the loaders ---------------------------------------------------------------------------
def _webdataset(urls: list[str], options: dict[str, Any], batch: int, workers: int) -> Any:
    import fsspec
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    if urls[0].startswith("s3://"):
        s3_options = options["s3"]

        def open_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
            return fsspec.open(url, mode, **s3_options).open()

        wds.gopen_schemes["s3"] = open_s3
    # http(s): webdataset's own default, a ``curl`` process per shard piping the body
    transform = T.Compose([T.Resize((224, 224)), T.PILToTensor()])
    ds = (
        wds.WebDataset(urls, shardshuffle=100, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(transform, int)
    )
    return torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)


def _litdata(root: str, options: dict[str, Any], cache: str, batch: int, workers: int) -> Any:
    import litdata
    import litdata.streaming.downloader as downloader
    from torchvision.transforms.v2.functional import resize

    # litdata's S3 reads go through obstore, whose client refuses a plain-http endpoint
    # unless allowed; the loopback server has no TLS
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    s3 = options["s3"]
    storage = {
        "endpoint_url": s3["endpoint_url"],
        "aws_access_key_id": s3["key"],
        "aws_secret_access_key": s3["secret"],
        "region_name": "us-east-1",
    }

    def transform(item: dict[str, Any]) -> dict[str, Any]:
        return {"jpg": resize(item["jpg"], [224, 224], antialias=True), "cls": item["cls"]}

    ds = litdata.StreamingDataset(
        root, cache_dir=cache, shuffle=True, storage_options=storage, transform=transform
    )
    return litdata.StreamingDataLoader(
        ds, batch_size=batch, num_workers=workers, multiprocessing_context="fork"
    )


def _loader(setup: dict[str, Any], run: dict[str, Any], cache: str) -> Any:
    impl, transport = run["impl"], run["transport"]
    batch, workers = run["batch"], run["workers"]
    if impl == "webdataset":
        return _webdataset(setup[transport], setup["options"], batch, workers)
    if impl == "litdata":
        return _litdata(setup["litdata"], setup["options"], cache, batch, workers)
    import torch_spdl
    from torch_spdl.streaming import StreamingDataset

    kwargs = dict(setup.get("spdl_kwargs", {}))
    if run.get("cache"):
        kwargs["cache_dir"] = cache
    ds = StreamingDataset(
        setup[transport], image_size=(224, 224), storage_options=setup["options"], **kwargs
    )
    run["dataset"] = ds
    return torch_spdl.DataLoader(ds, batch_size=batch, num_workers=workers)


def _images(batch: Any) -> Any:
    return batch["jpg"] if isinstance(batch, dict) else batch[0]


class _ConsumerCpu:
    """The CPU a consumer uses in the training process: its main thread's inside the
    consumer calls, plus the threads the consumer started (torch's intra-op pool, made by
    a warm-up call before the clock), which nothing else in the process runs on."""

    def __init__(self, consume: Any) -> None:
        import psutil

        self.proc = psutil.Process()
        before = {t.id for t in self.proc.threads()}
        consume(None)  # a warm-up step on the fixed input: its threads exist from here
        self.own = {t.id for t in self.proc.threads()} - before
        self.consume = consume
        self.main_s = 0.0

    def threads_cpu(self) -> float:
        return sum(t.user_time + t.system_time for t in self.proc.threads() if t.id in self.own)

    def __call__(self, batch: Any) -> None:
        t0 = time.thread_time()
        self.consume(batch)
        self.main_s += time.thread_time() - t0


def _state_bytes(loader: Any) -> int | None:
    """One worker's resumable state, pickled (the largest of them)."""
    states = loader.state_dict().get("dataset_states") or {}
    return max((len(pickle.dumps(s)) for s in states.values()), default=None)


def _epoch(loader: Any, consume: _ConsumerCpu, state_at: int | None) -> dict[str, Any]:
    from _measure import CpuMeter

    meter = CpuMeter()
    meter.start()
    main0, threads0 = consume.main_s, consume.threads_cpu()
    t0 = time.perf_counter()
    samples, shape, first, state = 0, None, None, None
    for b, batch in enumerate(loader):
        if first is None:
            first = time.perf_counter() - t0
        consume(batch)
        images = _images(batch)
        samples += len(images)
        shape = tuple(images.shape[1:])
        if b == state_at:
            state = _state_bytes(loader)
    seconds = time.perf_counter() - t0
    meter.stop()
    return {
        "samples": samples,
        "seconds": seconds,
        "first_s": first,
        "cpu_s": meter.cpu_s,
        "consumer_cpu_s": consume.main_s - main0 + consume.threads_cpu() - threads0,
        "foreign_cpu_s": meter.foreign_s,
        "shape": shape,
        "state_bytes": state,
    }


def run_once(setup: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """The epochs of one run (``run``: impl, transport, epochs, cache, batch, workers,
    consumer), each measured on its own; the loader is made inside the first one's clock."""
    import gc
    import shutil

    import fsspec  # noqa: F401  (imports are not what is measured)
    import s3fs  # noqa: F401
    import torchvision.transforms  # noqa: F401
    import webdataset  # noqa: F401
    from _consumers import consumer_of

    import torch_spdl.data  # noqa: F401
    import torch_spdl.streaming  # noqa: F401
    from torch_spdl.io import load_image  # noqa: F401  (torch_spdl.io loads it lazily)

    if run["impl"] == "litdata":
        import litdata  # noqa: F401
    consume = _ConsumerCpu(consumer_of(run["consumer"]))
    cache = tempfile.mkdtemp(prefix="torch_spdl_bench_cache_")
    results = []
    try:
        t0 = time.perf_counter()
        loader = _loader(setup, run, cache)
        made = time.perf_counter() - t0
        for epoch in range(run["epochs"]):
            if "dataset" in run:
                run["dataset"].set_epoch(epoch)
            state_at = run["state_at"] if run["impl"] == "torch_spdl" else None
            result = _epoch(loader, consume, state_at)
            if epoch == 0:
                result["first_s"] += made
                result["seconds"] += made
            results.append(result)
        del loader
        gc.collect()
    finally:
        run.pop("dataset", None)
        shutil.rmtree(cache, ignore_errors=True)
    return results
