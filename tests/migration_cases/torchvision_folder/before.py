"""torchvision's ImageFolder with random augmentation, as pytorch/examples' imagenet and
torchvision's classification reference build it; and a DatasetFolder with a loader of the
script's own, which the tool leaves alone."""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.data
import torchvision.datasets as datasets
from torchvision import transforms


def load_npy(path: str) -> np.ndarray:
    return np.load(path)


def make_loader(root: str, num_workers: int = 2) -> torch.utils.data.DataLoader:
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(16),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )
    dataset = datasets.ImageFolder(root, transform)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=num_workers,
    )


def make_arrays(root: str) -> datasets.DatasetFolder:
    return datasets.DatasetFolder(root, loader=load_npy, extensions=(".npy",))
