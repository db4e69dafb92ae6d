"""Windows of a large array read through a memory map (only the touched pages are read)."""

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class WindowDataset(Dataset):
    def __init__(self, data_path, labels_path, window=16):
        self.data = np.load(data_path, mmap_mode="r")  # (samples, window)
        self.labels = np.load(labels_path)
        self.window = window

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        window = np.array(self.data[i])  # the copy reads the pages
        x = torch.from_numpy(window).float()
        x = (x - x.mean()) / (x.std() + 1e-6)
        return x, int(self.labels[i])


def make_loader(data_path, labels_path, num_workers=4):
    dataset = WindowDataset(data_path, labels_path)
    return DataLoader(
        dataset, batch_size=5, shuffle=False, num_workers=num_workers, pin_memory=True
    )
