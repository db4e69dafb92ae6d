"""Test data for the case: numbered PNG frames of a few clips."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(8)
    for clip in range(5):
        for t in range(3):
            pixels = rng.integers(0, 256, (5, 6), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"clip{clip:03d}_{t}.png")
    return {"root": str(root), "num_clips": 5}
