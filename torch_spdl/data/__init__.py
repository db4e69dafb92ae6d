"""The torch face: a drop-in DataLoader, staged datasets, a pipeline as an iterable dataset
(``PipelineDataset``), worker info, and how a loader chooses between threads and processes
(``worker_type="auto"``).

``PipelineDataset`` is imported on first use: it declares pipelines, and a script that
only swaps its ``DataLoader`` import does not load the engine (``torch_spdl.pipeline``'s
notes)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._dataloader import DataLoader
from ._epoch.thread_or_process import WorkerChoice
from ._loading.staged_dataset import Stage, StagedDataset
from ._loading.worker_info import WorkerInfo, get_worker_info
from ._workers.worker_record import WorkerFailure

if TYPE_CHECKING:
    from ._pipeline_dataset import PipelineDataset

__all__ = [
    "DataLoader",
    "PipelineDataset",
    "Stage",
    "StagedDataset",
    "WorkerChoice",
    "WorkerFailure",
    "WorkerInfo",
    "get_worker_info",
]


def __getattr__(name: str) -> Any:
    if name == "PipelineDataset":
        value = importlib.import_module("._pipeline_dataset", __name__).PipelineDataset
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
