"""Windows of a large array read through a memory map (only the touched pages are read)."""

import numpy as np
import torch
from torch.utils.data import Dataset
from torch_spdl import DataLoader, StagedDataset


class WindowDataset(StagedDataset, Dataset):
    def __init__(self, data_path, labels_path, window=16):
        self.data = np.load(data_path, mmap_mode="r")  # (samples, window)
        self.labels = np.load(labels_path)
        self.window = window

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.process(self.load(i))

    def load(self, i):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        window = np.array(self.data[i])  # the copy reads the pages
        return window, i

    def process(self, raw):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        window, i = raw
        x = torch.from_numpy(window).float()
        x = (x - x.mean()) / (x.std() + 1e-6)
        return x, int(self.labels[i])


def make_loader(data_path, labels_path, num_workers=4):
    dataset = WindowDataset(data_path, labels_path)
    return DataLoader(
        dataset, batch_size=5, shuffle=False, num_workers=num_workers, pin_memory=True
    )
