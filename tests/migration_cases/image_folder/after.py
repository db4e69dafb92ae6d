"""An ImageFolder-style dataset: one folder per class, PIL decoding, torchvision transforms."""

from __future__ import annotations

import os

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms
from torch_spdl import DataLoader, StagedDataset


class ImageFolderDataset(StagedDataset, Dataset):
    """``root/<class>/<image>.jpg``, labelled by the index of the class folder."""

    def __init__(self, root: str, transform=None) -> None:
        self.classes = sorted(os.listdir(root))
        self.samples = []
        for label, name in enumerate(self.classes):
            folder = os.path.join(root, name)
            for file in sorted(os.listdir(folder)):
                self.samples.append((os.path.join(folder, file), label))
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        return self.process(self.load(index))

    def load(self, index: int):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        path, label = self.samples[index]
        # decode now, so that the file is closed before we return
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")
        return image, label

    def process(self, raw):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        image, label = raw
        if self.transform is not None:
            image = self.transform(image)
        return image, label


def make_loader(root: str, num_workers: int = 4) -> DataLoader:
    transform = transforms.Compose(
        [transforms.Resize((16, 16)), transforms.CenterCrop(12), transforms.PILToTensor()]
    )
    dataset = ImageFolderDataset(root, transform=transform)
    return DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,  # a seeded generator: the same order on every run
        generator=torch.Generator().manual_seed(0),
        num_workers=num_workers,
    )
