"""The torch face: a drop-in DataLoader, staged datasets, worker info."""

from ._dataloader import DataLoader
from ._staged import Stage, StagedDataset
from ._worker import WorkerInfo, get_worker_info

__all__ = ["DataLoader", "Stage", "StagedDataset", "WorkerInfo", "get_worker_info"]
