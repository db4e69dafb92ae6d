"""Test data for the case: a .npy array (memory-mapped by the dataset) and labels."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    np.save(root / "data.npy", rng.normal(size=(13, 16)).astype(np.float32))
    np.save(root / "labels.npy", np.arange(13) % 2)
    return {"data_path": str(root / "data.npy"), "labels_path": str(root / "labels.npy")}
