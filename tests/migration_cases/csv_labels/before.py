"""Labels and image paths listed in a CSV file; torchvision reads and decodes the JPEGs."""

import csv
from pathlib import Path

import torch
import torch.utils.data
import torchvision.io


class CsvImageDataset(torch.utils.data.Dataset):
    def __init__(self, csv_path):
        root = Path(csv_path).parent
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        self.paths = [root / row["path"] for row in rows]
        self.labels = [int(row["label"]) for row in rows]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, idx):
        data = torchvision.io.read_file(str(self.paths[idx]))
        image = torchvision.io.decode_jpeg(data)
        image = image.float().div(255)
        label = torch.tensor(self.labels[idx])
        return image, label


def make_loader(csv_path, num_workers=2):
    return torch.utils.data.DataLoader(
        CsvImageDataset(csv_path),
        batch_size=3,
        num_workers=num_workers,
        drop_last=True,
        persistent_workers=num_workers > 0,
        timeout=60,
    )
