"""Test data for the case: small arrays as .npy files.

``LOADERS``: the loader factories to compare and the ``num_workers`` of the torch_spdl run.
The shared-generator dataset matches only when its samples run one at a time, in order.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

LOADERS = {"make_loader": 2, "make_shared_loader": 0}


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(6)
    for i in range(8):
        np.save(root / f"{i:02d}.npy", rng.normal(size=(9, 10)))
    return {"root": str(root)}
