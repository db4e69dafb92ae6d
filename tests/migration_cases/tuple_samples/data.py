"""Test data for the case: PNG images and a list of pairs."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(5)
    paths = []
    for i in range(6):
        path = root / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    pairs = [(paths[i % 6], paths[(i * 5) % 6], int(i % 2 == 0)) for i in range(7)]
    return {"pairs": pairs}
