"""Random crops, flips and noise, reproducible from a seed.

``AugmentedDataset`` derives each sample's generator from (seed, index): the draws of a
sample do not depend on which worker runs it, or when. ``SharedRngDataset`` keeps one
seeded generator for all samples: its draws follow the order in which each worker
processes its samples, which torch_spdl's worker processes keep as torch's, so the tool
splits it too (the draw is after the read: it runs in the workers) and says so.
"""

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torch_spdl import DataLoader, StagedDataset


class AugmentedDataset(StagedDataset, Dataset):
    def __init__(self, root, crop=6, seed=0):
        self.files = sorted(Path(root).glob("*.npy"))
        self.crop = crop
        self.seed = seed

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        return self.process(self.load(index))

    def load(self, index):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        image = np.load(self.files[index])
        return index, image

    def process(self, raw):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        index, image = raw
        rng = np.random.default_rng((self.seed, index))
        top = rng.integers(0, image.shape[0] - self.crop + 1)
        left = rng.integers(0, image.shape[1] - self.crop + 1)
        patch = image[top : top + self.crop, left : left + self.crop]
        if rng.random() < 0.5:
            patch = patch[:, ::-1]
        patch = patch + rng.normal(0.0, 0.1, size=patch.shape)
        return torch.from_numpy(patch.astype(np.float32))


class SharedRngDataset(StagedDataset, Dataset):
    def __init__(self, root, crop=6, seed=0):
        self.files = sorted(Path(root).glob("*.npy"))
        self.crop = crop
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        return self.process(self.load(index))

    def load(self, index):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        image = np.load(self.files[index])
        return image

    def process(self, image):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        top = self.rng.integers(0, image.shape[0] - self.crop + 1)
        patch = image[top : top + self.crop, : self.crop]
        return torch.from_numpy(patch.astype(np.float32))


def make_loader(root, num_workers=2):
    return DataLoader(AugmentedDataset(root), batch_size=3, num_workers=num_workers)


def make_shared_loader(root, num_workers=0):
    return DataLoader(SharedRngDataset(root), batch_size=3, num_workers=num_workers)
