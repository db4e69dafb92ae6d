"""An HDF5 file opened lazily, once per worker: an h5py handle must not cross a fork."""

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class H5Dataset(Dataset):
    def __init__(self, path: str) -> None:
        self.path = path
        self.file = None  # opened in the worker, on first use
        with h5py.File(path, "r") as f:
            self.length = len(f["images"])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        image = self.file["images"][index]
        label = int(self.file["labels"][index])
        # CPU: normalise and convert
        image = torch.from_numpy(image.astype(np.float32) / 255.0)
        image = (image - 0.5) / 0.25
        return {"image": image, "label": label}


def make_loader(path: str, num_workers: int = 2) -> DataLoader:
    return DataLoader(H5Dataset(path), batch_size=4, num_workers=num_workers)
