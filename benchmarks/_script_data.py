"""The files that ``real_scripts.py``'s training scripts read, made once before any run,
in the layouts their public originals expect.

Why one directory for all: the latency store (``_latency_fs.py``) serves one directory,
and every script takes it as its data root, as a user points a script at a mount:
``DATA/train/CLASS/*.jpg`` (ImageFolder: imagenet, the classification reference, the
detection script), ``DATA/BSDS300/images/train/*.jpg`` (super_resolution's flat folder)
and ``DATA/MNIST/complete/{training,test}.pt`` (the MNIST of ``lightning.pytorch.demos``,
a pair of uint8 images and int64 labels that it loads whole). The images are photo-like
160x120 JPEGs (a smooth pattern with noise, about 10 KB each: one read through the
store), drawn from a seeded generator, so every session makes the same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path


def _jpegs(count: int, seed: int) -> list[bytes]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:120, 0:160]
    out = []
    for i in range(count):
        base = rng.integers(0, 256, 3)
        img = (base + 60 * np.sin(x[..., None] / (7 + i % 11) + y[..., None] / 13)).clip(0, 255)
        img = (img + rng.normal(0, 12, img.shape)).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _mnist(folder: Path, train: int, test: int, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("training.pt", train), ("test.pt", test)):
        labels = torch.randint(0, 10, (n,), generator=g)
        images = torch.randint(0, 64, (n, 28, 28), generator=g, dtype=torch.uint8)
        for digit in range(10):  # a bright bar per label: something to learn
            images[labels == digit, 2 + 2 * digit : 5 + 2 * digit, 4:24] = 255
        torch.save((images, labels), folder / name)


def make_data(root: Path, images: int, classes: int = 4, seed: int = 0) -> None:
    """Every script's files under ``root``: ``images`` JPEGs in ImageFolder layout over
    ``classes`` folders, the same in one flat folder, and 6,000 + 1,000 MNIST images."""
    flat = root / "BSDS300" / "images" / "train"
    flat.mkdir(parents=True)
    for i, data in enumerate(_jpegs(images, seed)):
        folder = root / "train" / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:05d}.jpg").write_bytes(data)
        (flat / f"img_{i:05d}.jpg").write_bytes(data)
    _mnist(root / "MNIST" / "complete", 6000, 1000, seed)
