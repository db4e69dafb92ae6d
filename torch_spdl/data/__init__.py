"""The torch face: a drop-in DataLoader, staged datasets, a pipeline as an iterable dataset
(``PipelineDataset``), worker info, and how a loader chooses between threads and processes
(``worker_type="auto"``)."""

from ._dataloader import DataLoader
from ._pipeline_dataset import PipelineDataset
from ._process_pool import WorkerFailure
from ._staged_dataset import Stage, StagedDataset
from ._thread_or_process import WorkerChoice
from ._worker_info import WorkerInfo, get_worker_info

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
