"""An HDF5 file opened lazily, once per worker: an h5py handle must not cross a fork."""

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset
from torch_spdl import DataLoader, StagedDataset


class H5Dataset(StagedDataset, Dataset):
    def __init__(self, path: str) -> None:
        self.path = path
        self.file = None  # opened in the worker, on first use
        with h5py.File(path, "r") as f:
            self.length = len(f["images"])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return self.process(self.load(index))

    def load(self, index: int):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        image = self.file["images"][index]
        label = int(self.file["labels"][index])
        return image, label

    def process(self, raw) -> dict:
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        image, label = raw
        # CPU: normalise and convert
        image = torch.from_numpy(image.astype(np.float32) / 255.0)
        image = (image - 0.5) / 0.25
        return {"image": image, "label": label}


def make_loader(path: str, num_workers: int = 2) -> DataLoader:
    return DataLoader(H5Dataset(path), batch_size=4, num_workers=num_workers)
