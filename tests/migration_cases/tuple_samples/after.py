"""Pairs of images with a same/different target; each sample is a 3-tuple."""

import torch
from torch_spdl import DataLoader as TorchLoader, StagedDataset
from torch.utils.data import Dataset
from torchvision.io import read_image
from torchvision.transforms import v2


class PairDataset(StagedDataset, Dataset):
    def __init__(self, pairs, size=8):
        self.pairs = pairs  # (left path, right path, same)
        self.resize = v2.Resize((size, size), antialias=True)

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, index):
        return self.process(self.load(index))

    def load(self, index):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        left_path, right_path, same = self.pairs[index]
        left = read_image(left_path)
        right = read_image(right_path)
        return left, right, same

    def process(self, raw):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        left, right, same = raw
        left = self.resize(left)
        right = self.resize(right)
        return left, right, torch.tensor(same, dtype=torch.float32)


def make_loader(pairs, num_workers=2):
    return TorchLoader(PairDataset(pairs), batch_size=2, num_workers=num_workers)
