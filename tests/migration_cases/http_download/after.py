"""Images downloaded over HTTP, one request per sample."""

import io
import urllib.request

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torch_spdl import DataLoader, StagedDataset


class RemoteImageDataset(StagedDataset, Dataset):
    def __init__(self, base_url, names, timeout=10.0):
        self.base_url = base_url.rstrip("/")
        self.names = names
        self.timeout = timeout

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        return self.process(self.load(index))

    def load(self, index):
        """The I/O part of ``__getitem__`` (split by torch-spdl migrate)."""
        url = f"{self.base_url}/{self.names[index]}"
        with urllib.request.urlopen(url, timeout=self.timeout) as response:
            payload = response.read()
        return payload

    def process(self, payload):
        """The CPU part of ``__getitem__`` (split by torch-spdl migrate)."""
        image = Image.open(io.BytesIO(payload)).convert("L")
        pixels = np.asarray(image, dtype=np.uint8).copy()
        return torch.from_numpy(pixels), len(payload)


def make_loader(base_url, names, num_workers=8):
    return DataLoader(RemoteImageDataset(base_url, names), batch_size=4, num_workers=num_workers)
