"""Test data for the case: two class folders of tiny JPEGs."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "dog"]):
        folder = root / name
        folder.mkdir()
        for i in range(5 + c):
            pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=90)
    return {"root": str(root)}
