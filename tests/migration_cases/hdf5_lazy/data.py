"""Test data for the case: an HDF5 file with an image and a label dataset."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(2)
    path = root / "data.h5"
    with h5py.File(path, "w") as f:
        f["images"] = rng.integers(0, 256, (11, 4, 5), dtype=np.uint8)
        f["labels"] = np.arange(11, dtype=np.int64) % 3
    return {"path": str(path)}
