"""Test data for the case: JPEGs and a CSV of (path, label).

``TORCH_WORKERS``: torch's DataLoader runs with worker processes here (its ``timeout`` and
``persistent_workers`` need them), the other cases compare against ``num_workers=0``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

TORCH_WORKERS = 2


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    (root / "images").mkdir()
    lines = ["path,label"]
    for i in range(10):
        name = f"images/{i:02d}.jpg"
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / name)
        lines.append(f"{name},{i % 4}")
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return {"csv_path": str(root / "labels.csv")}
