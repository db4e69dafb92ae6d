"""Test data for the case: sequences of different lengths as .npy files."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(9)
    for i in range(11):
        np.save(root / f"{i:02d}.npy", rng.normal(size=int(rng.integers(2, 9))))
    return {"root": str(root)}
