"""Records as JSON files pointing at feature arrays; each sample is a dict."""

import json
from pathlib import Path

import numpy as np
import torch
from torch.utils import data


class RecordDataset(data.Dataset):
    def __init__(self, root):
        self.root = Path(root)
        self.ids = sorted(p.stem for p in self.root.glob("*.json"))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        record_path = self.root / f"{self.ids[index]}.json"
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
        features = np.load(self.root / record["features"])

        sample = {
            "id": record["id"],
            "features": torch.from_numpy(features).float(),
            "tags": torch.tensor(record["tags"]),
            "score": record["score"],
        }
        sample["norm"] = sample["features"].norm()
        return sample


def make_loader(root, num_workers=2):
    return data.DataLoader(
        RecordDataset(root),
        batch_size=4,
        num_workers=num_workers,
        prefetch_factor=4 if num_workers else None,
    )
