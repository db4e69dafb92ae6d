"""Labels and image paths listed in a CSV file; torchvision reads and decodes the JPEGs."""

import csv
from pathlib import Path

import torch
import torch.utils.data
import torchvision.io
import torch_spdl
from torch_spdl import StagedDataset


class CsvImageDataset(StagedDataset, torch.utils.data.Dataset):
    def __init__(self, csv_path):
        root = Path(csv_path).parent
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        self.paths = [root / row["path"] for row in rows]
        self.labels = [int(row["label"]) for row in rows]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, idx):
        return self.process(self.load(idx))

    def load(self, idx):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        data = torchvision.io.read_file(str(self.paths[idx]))
        return data, idx

    def process(self, raw):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        data, idx = raw
        image = torchvision.io.decode_jpeg(data)
        image = image.float().div(255)
        label = torch.tensor(self.labels[idx])
        return image, label


def make_loader(csv_path, num_workers=2):
    return torch_spdl.DataLoader(
        CsvImageDataset(csv_path),
        batch_size=3,
        num_workers=num_workers,
        drop_last=True,
        persistent_workers=num_workers > 0,
        timeout=60,
    )
