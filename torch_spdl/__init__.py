"""torch_spdl: fast staged data loading for PyTorch.

``torch_spdl.pipeline`` is the engine. The torch-facing names (``DataLoader``,
``StagedDataset``, ``PipelineDataset``...) are imported on first use, so that importing
``torch_spdl`` (in a spawned subprocess, say) does not import torch; the engine's names
too, so that a script that only uses the ``DataLoader`` does not load the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .data import DataLoader as DataLoader
    from .data import PipelineDataset as PipelineDataset
    from .data import Stage as Stage
    from .data import StagedDataset as StagedDataset
    from .data import WorkerInfo as WorkerInfo
    from .data import get_worker_info as get_worker_info
    from .pipeline import Pipeline as Pipeline
    from .pipeline import PipelineBuilder as PipelineBuilder
    from .pipeline import PipelineFailure as PipelineFailure

__version__ = "0.1.0"

_LAZY = {
    "Pipeline": ".pipeline",
    "PipelineBuilder": ".pipeline",
    "PipelineFailure": ".pipeline",
    "DataLoader": ".data",
    "Stage": ".data",
    "StagedDataset": ".data",
    "WorkerInfo": ".data",
    "get_worker_info": ".data",
    "PipelineDataset": ".data",
}

__all__ = ["__version__", *_LAZY]

_SUBPACKAGES = ("io", "source", "data", "lightning", "pipeline", "vision")  # imported on first use


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'torch_spdl' has no attribute {name!r}")
