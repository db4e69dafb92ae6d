"""The main job: load generated JPEGs through a staged pipeline and print the throughput.

It writes a few hundred JPEG files to a temporary folder, then reads them (I/O stage, high
concurrency), decodes and resizes them (CPU stage, on threads: PIL releases the GIL),
batches them and collates each batch into one uint8 tensor, and compares the images/s with
a plain single-threaded loop doing the same work.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from torch_spdl.pipeline import PipelineBuilder


def make_images(root: Path, n: int, size: tuple[int, int] = (500, 375)) -> list[Path]:
    """Write ``n`` random-ish JPEGs (smooth gradients plus noise, so they compress like photos)."""
    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    paths = []
    for i in range(n):
        base = (xx * (i % 7 + 1) + yy * (i % 5 + 1)) % 256
        noise = rng.integers(0, 32, size=(h, w, 3))
        pixels = (base[..., None] + noise).astype(np.uint8)
        path = root / f"img_{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def read(path: Path) -> bytes:
    return path.read_bytes()


def decode(data: bytes) -> np.ndarray:
    import io

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB").resize((224, 224)))


def collate(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        paths = make_images(Path(tmp), args.images)
        print(f"generated {len(paths)} JPEGs (500x375) in {tmp}; {os.cpu_count()} cores")

        t0 = time.perf_counter()
        for i in range(0, len(paths), args.batch_size):
            collate([decode(read(p)) for p in paths[i : i + args.batch_size]])
        serial = len(paths) / (time.perf_counter() - t0)

        pipeline = (
            PipelineBuilder()
            .add_source(paths)
            .pipe(read, concurrency=8, name="read")
            .pipe(decode, concurrency=os.cpu_count() or 2, name="decode")
            .aggregate(args.batch_size)
            .pipe(collate, name="collate")
            .add_sink(4)
            .build()
        )
        t0 = time.perf_counter()
        count = 0
        with pipeline.auto_stop():
            for batch in pipeline:
                assert batch.dtype == torch.uint8 and batch.shape[1:] == (3, 224, 224)
                count += batch.shape[0]
        staged = count / (time.perf_counter() - t0)
        assert count == len(paths), (count, len(paths))
        print(pipeline.format_stats())
        print(f"plain loop: {serial:8.1f} images/s")
        print(f"pipeline  : {staged:8.1f} images/s  ({staged / serial:.2f}x)")


if __name__ == "__main__":
    main()
