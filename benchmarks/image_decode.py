"""Image decoding speed: torch_spdl.io against PIL, and a pipeline against torch's DataLoader.

Run: ``python benchmarks/image_decode.py [--quick]``. Prints a table; asserts nothing.

- Per core: decode + resize to 224x224 of generated JPEGs (quality 90) held in memory, one
  thread: ``torch_spdl.io.load_image(data, width=224, height=224)`` (FFmpeg, MJPEG
  ``lowres`` when the source is at least twice the target) against
  ``Image.open().convert("RGB").resize((224, 224))``.
- End to end, 2 workers, batch 256, JPEGs on disk in ImageFolder layout: a torch_spdl
  pipeline (read bytes -> decode+resize on threads -> aggregate -> ``convert_frames`` into one
  reused buffer (``BufferPool``) -> ``to_torch``) against
  ``torch.utils.data.DataLoader(num_workers=2)`` over ``torchvision.datasets.ImageFolder``
  with ``Resize((224, 224))`` + ``PILToTensor()``.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

import torch_spdl.io as tio
from torch_spdl.pipeline import PipelineBuilder

SIZES = {"500x375": (500, 375), "1920x1080": (1920, 1080)}


def make_jpegs(width: int, height: int, count: int, seed: int = 0) -> list[bytes]:
    """Photo-like test images: smooth colour fields, edges and some sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for i in range(count):
        fx, fy = rng.uniform(2, 8, 2)
        r = 128 + 100 * np.sin(x / width * fx + i)
        g = 128 + 100 * np.cos(y / height * fy - i)
        b = ((x + y + 40 * i) % 256) * ((x // 97 + y // 71) % 2)
        img = np.stack([r, g, b], -1) + rng.normal(0, 6, (height, width, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def rate(fn: Callable[[bytes], object], images: list[bytes], repeats: int) -> float:
    """Best images/s over ``repeats`` passes, one thread."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for data in images:
            fn(data)
        best = min(best, time.perf_counter() - start)
    return len(images) / best


def ours(data: bytes) -> object:
    return tio.load_image(data, width=224, height=224)


def pil(data: bytes) -> object:
    return Image.open(io.BytesIO(data)).convert("RGB").resize((224, 224))


def write_folder(root: Path, images: list[bytes], classes: int = 4) -> list[Path]:
    paths = []
    for i, data in enumerate(images):
        d = root / f"class{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{i:05d}.jpg"
        p.write_bytes(data)
        paths.append(p)
    return paths


def write_photo_folder(root: Path, count: int) -> None:
    """``count`` photo-like 500x375 JPEGs (128 distinct, repeated) in ImageFolder layout."""
    images = make_jpegs(500, 375, min(count, 128), seed=1)
    write_folder(root, (images * (count // len(images) + 1))[:count])


def spdl_epoch(paths: list[Path], batch: int) -> tuple[int, float]:
    def decode(p: Path) -> tio.ImageFrames:
        return tio.decode_image(p.read_bytes(), width=224, height=224)

    pool = tio.BufferPool(max_buffers=6)  # the sink's 4 batches, one in the making, one read

    def collate(frames: list[tio.ImageFrames]) -> object:
        return tio.to_torch(tio.convert_frames(frames, pool=pool)).permute(0, 3, 1, 2)

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .pipe(decode, concurrency=2, output_order="input")
        .aggregate(batch)
        .pipe(collate)
        .add_sink(4)
        .build()
    )
    start = time.perf_counter()
    n = sum(len(b) for b in pipeline)
    return n, time.perf_counter() - start


def torch_epoch(root: Path, batch: int) -> tuple[int, float]:
    import torch
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    tf = transforms.Compose([transforms.Resize((224, 224)), transforms.PILToTensor()])
    loader = torch.utils.data.DataLoader(
        ImageFolder(str(root), transform=tf), batch_size=batch, num_workers=2
    )
    start = time.perf_counter()
    n = sum(len(x) for x, _ in loader)
    return n, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images, fewer repeats")
    args = parser.parse_args()
    n_small, n_big, repeats, n_e2e = (60, 20, 2, 768) if args.quick else (300, 80, 3, 2560)
    batch = 256
    import torch

    torch.set_num_threads(1)
    print(f"cores: {os.cpu_count()}, quick: {args.quick}")
    rows = []
    for name, (w, h) in SIZES.items():
        images = make_jpegs(w, h, n_small if w < 1000 else n_big)
        a, b = rate(ours, images, repeats), rate(pil, images, repeats)
        rows.append((f"per core, {name} -> 224x224", a, b))
    for name, (w, h) in SIZES.items():
        count = n_e2e if w < 1000 else n_e2e // 4
        images = make_jpegs(w, h, min(count, 256), seed=1)
        images = (images * (count // len(images) + 1))[:count]
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            paths = write_folder(root, images)
            best_s = best_t = 0.0
            for _ in range(repeats):
                n, s = spdl_epoch(paths, batch)
                best_s = max(best_s, n / s)
                n, s = torch_epoch(root, batch)
                best_t = max(best_t, n / s)
        rows.append((f"2 workers, batch {batch}, {name}", best_s, best_t))
    print(f"| {'case':<38} | {'torch_spdl img/s':>16} | {'reference img/s':>15} | speedup |")
    print(f"| {'-' * 38} | {'-' * 16}:| {'-' * 15}:| ------: |")
    for case, a, b in rows:
        print(f"| {case:<38} | {a:>16,.1f} | {b:>15,.1f} | {a / b:>6.2f}x |")
    print("reference: PIL open+convert+resize per core; torch DataLoader + ImageFolder end to end")


if __name__ == "__main__":
    main()
