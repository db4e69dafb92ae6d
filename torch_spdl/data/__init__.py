"""The torch face: a drop-in DataLoader, staged datasets, a pipeline as an iterable dataset
(``PipelineDataset``), worker info, and how a loader chooses between threads and processes
(``worker_type="auto"``)."""

from ._dataloader import DataLoader
from ._pipeline_dataset import PipelineDataset
from ._process_pool import WorkerFailure
from ._staged import Stage, StagedDataset
from ._worker import WorkerInfo, get_worker_info
from ._worker_choice import Measurement, WorkerChoice, decide

__all__ = [
    "DataLoader",
    "Measurement",
    "PipelineDataset",
    "Stage",
    "StagedDataset",
    "WorkerChoice",
    "WorkerFailure",
    "WorkerInfo",
    "decide",
    "get_worker_info",
]
