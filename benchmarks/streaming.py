"""Streaming WebDataset shards from S3: torch_spdl.streaming against webdataset's loader,
each inside the same training loop.

    .venv/bin/python benchmarks/streaming.py --quick     # 8 shards x 64 small JPEGs, 2 runs a side
    .venv/bin/python benchmarks/streaming.py             # 64 shards x 256 JPEGs (320x240), 3 a side

The same shards (``__key__.jpg`` + ``__key__.cls``) are put on moto's S3 server, run in a
process of its own on 127.0.0.1 with 20 ms added to every request (``--latency``), and
read by:

- ``torch_spdl``: ``torch_spdl.DataLoader(StreamingDataset(urls, image_size=(224, 224)),
  batch_size=64, num_workers=2)``, the defaults otherwise (a shuffle buffer of 1000 raw
  samples per worker, decoded after it);
- ``webdataset``: ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode("pil")
  .to_tuple("jpg", "cls").map_tuple(Resize((224, 224)) + PILToTensor, int)`` in torch's
  ``DataLoader(batch_size=64, num_workers=2)``, as its documentation teaches (its
  ``.shuffle(1000)`` before ``.decode()`` also buffers 1000 raw samples per worker), with
  the S3 objects opened through fsspec (an ``s3`` opener registered in
  ``webdataset.gopen_schemes``: what a user without the aws CLI writes).

Both give ``uint8`` batches ``(64, 3, 224, 224)`` and shuffle shards and samples. A data
loader is judged inside a training script: every batch goes to the same consumer
(``--consumer``, from ``_consumers.py``, shared with ``swap.py``): ``train`` (default: a
small CNN's forward, backward and SGD step on the batch's first 32 images cropped to 64x64,
at torch's default intra-op threads, in the training process), ``touch`` (read every page),
``gpu`` (a GPU step's host cost) or ``count`` (nothing: the loader alone).

Each run is one epoch in a fresh process, the two loaders alternating; figures are medians
(min-max) of the runs: samples/s of the whole loop; CPU seconds per 1,000 samples of the
whole process tree (the run's process and its worker processes, ``getrusage``: this
*includes* the consumer's training step), and of the loader alone (the same, less the CPU
the consumer used: the training process's main thread inside the consumer call, plus
torch's intra-op threads, which only the consumer uses); and peak PSS of the run's process
tree, sampled every 50 ms from outside in one more run a side that is not timed (the
sampler costs the run it watches CPU: ``_measure``'s notes). ``--out DIR`` also writes the table to
``DIR/streaming.md`` (with the command and the machine), which the benchmark report
includes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


# -- the server process ------------------------------------------------------------------
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


def serve(shards: int, per_shard: int, width: int, height: int, latency: float) -> None:
    """Make the shards, start the S3 server, print its endpoint and the URLs, wait."""
    import numpy as np

    from torch_spdl.streaming.testing import LocalS3, write_shard

    rng = np.random.default_rng(0)
    with LocalS3() as s3:
        urls, total = [], 0
        for s in range(shards):
            samples = [
                {
                    "__key__": f"{s:04d}/{i:05d}",
                    "jpg": _jpeg(rng, width, height),
                    "cls": str(i % 10),
                }
                for i in range(per_shard)
            ]
            body = write_shard(samples)
            total += len(body)
            urls.append(s3.put("bench", f"train-{s:04d}.tar", body))
        s3.faults.latency = latency
        print(json.dumps({"options": s3.storage_options, "urls": urls, "bytes": total}), flush=True)
        sys.stdin.read()  # until the parent closes our stdin


# -- one measured run (a fresh process) --------------------------------------------------
def _loader(
    impl: str,
    urls: list[str],
    options: dict[str, Any],
    batch: int,
    workers: int,
    spdl_kwargs: dict[str, Any],
) -> Any:
    if impl == "torch_spdl":
        import torch_spdl
        from torch_spdl.streaming import StreamingDataset

        ds = StreamingDataset(urls, image_size=(224, 224), storage_options=options, **spdl_kwargs)
        return torch_spdl.DataLoader(ds, batch_size=batch, num_workers=workers)
    import fsspec
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    s3_options = options["s3"]

    def open_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        return fsspec.open(url, mode, **s3_options).open()

    wds.gopen_schemes["s3"] = open_s3
    transform = T.Compose([T.Resize((224, 224)), T.PILToTensor()])
    ds = (
        wds.WebDataset(urls, shardshuffle=100, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(transform, int)
    )
    return torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)


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
        self._threads_start = self._threads_cpu()

    def _threads_cpu(self) -> float:
        return sum(t.user_time + t.system_time for t in self.proc.threads() if t.id in self.own)

    def __call__(self, batch: Any) -> None:
        t0 = time.thread_time()
        self.consume(batch)
        self.main_s += time.thread_time() - t0

    def cpu_s(self) -> float:
        return self.main_s + self._threads_cpu() - self._threads_start


def run_once(
    impl: str, setup: dict[str, Any], batch: int, workers: int, consumer: str
) -> dict[str, Any]:
    import gc

    import fsspec  # noqa: F401  (imports are not what is measured)
    import s3fs  # noqa: F401
    import torchvision.transforms  # noqa: F401
    import webdataset  # noqa: F401
    from _consumers import consumer_of
    from _measure import CpuMeter

    import torch_spdl.data  # noqa: F401
    import torch_spdl.streaming  # noqa: F401
    from torch_spdl.io import load_image  # noqa: F401  (torch_spdl.io loads it lazily)

    consume = _ConsumerCpu(consumer_of(consumer))
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    kwargs = setup.get("spdl_kwargs", {})
    loader = _loader(impl, setup["urls"], setup["options"], batch, workers, kwargs)
    samples, shape = 0, None
    for batch_ in loader:
        consume(batch_)
        images = _images(batch_)
        samples += len(images)
        shape = tuple(images.shape[1:])
    seconds = time.perf_counter() - t0
    del loader
    gc.collect()
    meter.stop()
    return {
        "samples": samples,
        "seconds": seconds,
        "cpu_s": meter.cpu_s,
        "consumer_cpu_s": consume.cpu_s(),
        "shape": shape,
    }


# -- the side-by-side ----------------------------------------------------------------------
IMPLS = ("torch_spdl", "webdataset")


def _measure(
    impl: str, setup_file: str, batch: int, workers: int, consumer: str, memory: bool
) -> dict[str, Any]:
    """One run in a fresh process; ``memory``: sample its peak PSS (a run of its own, not
    timed: the sampler costs the run CPU, see ``_measure``'s notes)."""
    from _measure import PeakMemory

    cmd = [
        sys.executable,
        __file__,
        "--run",
        impl,
        "--setup",
        setup_file,
        "--batch",
        str(batch),
        "--workers",
        str(workers),
        "--consumer",
        consumer,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    sampler = PeakMemory(proc.pid) if memory else None
    with sampler or contextlib.nullcontext():
        out, _ = proc.communicate(timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} run failed (exit {proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_mib"] = sampler.peak_kb / 1024 if sampler is not None else None
    return result


def _fmt(values: list[float], digits: int = 0) -> str:
    med = statistics.median(values)
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _loader_cpu(r: dict[str, Any]) -> float:
    return r["cpu_s"] - r["consumer_cpu_s"]


def table(
    results: dict[str, list[dict[str, Any]]], peaks: dict[str, list[float]], consumer: str
) -> list[str]:
    """The timed runs' figures, and peak PSS from each side's memory runs."""
    rows = [
        f"consumer: `{consumer}` (every batch, both loaders)",
        "",
        "| loader | samples/s | CPU s per 1,000 samples, whole loop | of which the loader "
        "| peak PSS, MiB | runs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for impl, runs in results.items():
        rate = [r["samples"] / r["seconds"] for r in runs]
        cpu = [1000 * r["cpu_s"] / r["samples"] for r in runs]
        own = [1000 * _loader_cpu(r) / r["samples"] for r in runs]
        pss = peaks[impl]
        rows.append(
            f"| {impl} | {_fmt(rate)} | {_fmt(cpu, 2)} | {_fmt(own, 2)} | {_fmt(pss)} "
            f"| {len(runs)} |"
        )
    if all(results.values()) and len(results) == 2:

        def med(impl: str, fn: Any) -> float:
            return statistics.median(fn(r) for r in results[impl])

        def ratio(fn: Any) -> float:
            return med(IMPLS[0], fn) / med(IMPLS[1], fn)

        speed = ratio(lambda r: r["samples"] / r["seconds"])
        cpu = ratio(lambda r: r["cpu_s"] / r["samples"])
        own = ratio(lambda r: _loader_cpu(r) / r["samples"])
        pss = statistics.median(peaks[IMPLS[0]]) / statistics.median(peaks[IMPLS[1]])
        rows.append("")
        rows.append(
            f"torch_spdl / webdataset (medians): throughput {speed:.2f}x; CPU per sample "
            f"{cpu:.2f}x whole loop, {own:.2f}x the loader alone; peak PSS {pss:.2f}x "
            f"(target: throughput >= 1.5x at no more CPU per sample: "
            f"{'met' if speed >= 1.5 and cpu <= 1.0 else 'not met'})"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None, help="runs a side")
    parser.add_argument("--latency", type=float, default=0.02, help="added per request, s")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--consumer",
        choices=("train", "touch", "gpu", "count"),
        default="train",
        help="what the training loop does with each batch (train: a CNN step)",
    )
    parser.add_argument(
        "--spdl-kwargs",
        type=json.loads,
        default={},
        help="JSON: StreamingDataset arguments for the torch_spdl side (experiments; "
        "the report's figures use the defaults, {})",
    )
    parser.add_argument("--out", type=Path, default=None, help="write DIR/streaming.md")
    parser.add_argument("--serve", nargs=4, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve, latency=args.latency)
        return 0
    if args.run:
        setup = json.loads(Path(args.setup).read_text())
        print(json.dumps(run_once(args.run, setup, args.batch, args.workers, args.consumer)))
        return 0

    shards, per_shard, (w, h) = (8, 64, (160, 120)) if args.quick else (64, 256, (320, 240))
    repeats = args.repeats or (2 if args.quick else 3)
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(shards),
            str(per_shard),
            str(w),
            str(h),
            "--latency",
            str(args.latency),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        setup = json.loads(server.stdout.readline())
        setup_file = Path(f"/tmp/torch_spdl_streaming_bench_{os.getpid()}.json")
        setup_file.write_text(json.dumps({**setup, "spdl_kwargs": args.spdl_kwargs}))
        header = (
            f"{shards} shards x {per_shard} JPEG samples ({w}x{h}, "
            f"{setup['bytes'] / 2**20:.0f} MiB) on moto S3 (127.0.0.1, "
            f"{args.latency * 1000:.0f} ms added per request), decoded to 224x224, "
            f"batch {args.batch}, {args.workers} workers, {os.cpu_count()} cores, "
            f"consumer {args.consumer}"
        )
        if args.spdl_kwargs:
            header += f"; torch_spdl with {json.dumps(args.spdl_kwargs)}"
        print(header, flush=True)
        results: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLS}
        peaks: dict[str, list[float]] = {impl: [] for impl in IMPLS}
        # one memory run a side first, then the timed rounds without the sampler
        for r in range(-1, repeats):
            for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
                memory = r < 0
                out = _measure(
                    impl, str(setup_file), args.batch, args.workers, args.consumer, memory
                )
                assert out["samples"] == shards * per_shard, out
                assert tuple(out["shape"]) == (3, 224, 224), out
                if memory:
                    peaks[impl].append(out["peak_mib"])
                    print(f"  {impl}: peak {out['peak_mib']:.0f} MiB (memory run)", flush=True)
                    continue
                results[impl].append(out)
                print(
                    f"  {impl}: {out['samples'] / out['seconds']:,.0f} samples/s, "
                    f"{1000 * out['cpu_s'] / out['samples']:.2f} CPU s/1k "
                    f"({1000 * _loader_cpu(out) / out['samples']:.2f} the loader)",
                    flush=True,
                )
        setup_file.unlink()
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=60)
    rows = table(results, peaks, args.consumer)
    print("\n".join(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.date.today().isoformat()
        mode = "quick" if args.quick else "full"
        from _measure import machine

        info = machine()
        command = " ".join(["python", "benchmarks/streaming.py", *sys.argv[1:]])
        text = [
            f"{header}; {mode} mode, {stamp}.",
            "",
            f"Command: `{command}`; machine: {info['cores']} cores ({info['CPU']}), "
            f"{info['memory']}, torch {info['torch']}, torch_spdl {info['torch_spdl']}.",
            "",
            *rows,
            "",
        ]
        (args.out / "streaming.md").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
