"""Test data for the case: JSON records and .npy feature arrays."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(4)
    for i in range(9):
        np.save(root / f"f{i}.npy", rng.normal(size=6))
        record = {"id": f"r{i}", "features": f"f{i}.npy", "tags": [i, i + 1], "score": i / 8}
        (root / f"r{i}.json").write_text(json.dumps(record), encoding="utf-8")
    return {"root": str(root)}
