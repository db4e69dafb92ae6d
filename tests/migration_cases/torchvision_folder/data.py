"""Test data for the case: two class folders of small JPEGs (and one PNG, which
torchvision's loader converts to RGB).

``TORCH_WORKERS``: torch's DataLoader runs with 2 worker processes, as torch_spdl's does,
so the seeded random crops and flips are drawn by the same workers in both."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

TORCH_WORKERS = 2


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    for c, name in enumerate(["ants", "bees"]):
        folder = root / name
        folder.mkdir()
        for i in range(6 + c):
            pixels = rng.integers(0, 256, (30 + i, 28, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=85)
    grey = rng.integers(0, 256, (26, 26), dtype=np.uint8)
    Image.fromarray(grey).save(root / "bees" / "grey.png")
    return {"root": str(root)}
