"""The datasets several benchmarks measure: 10 ms waits, big tensors, ints, strings.

``dataloader.py`` compares the two loaders on them, and ``_cases.py`` (the report),
``engine.py`` and ``_swap_cells.py`` use the same ones, so that a figure means the same
dataset wherever it appears. They sit at module level so torch's forked workers and the
benchmarks' child processes see them; the sleeping ones come as a plain ``Dataset`` (for
torch) and as a ``StagedDataset`` whose ``load`` waits (sync, on I/O threads, or async).
"""

from __future__ import annotations

import asyncio
import time

import torch
from torch.utils.data import Dataset

from torch_spdl import StagedDataset


class SleepDataset(Dataset):
    """Every sample waits 10 ms, as on a remote read (torch's ``__getitem__``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(0.01)
        return i


class AsyncSleepStaged(StagedDataset):
    """The same 10 ms wait, in an ``async`` load (runs on the pipeline's event loop)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def load(self, i: int) -> int:
        await asyncio.sleep(0.01)
        return i


class SyncSleepStaged(StagedDataset):
    """The same 10 ms wait, in a sync load (runs on ``io_concurrency`` threads)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> int:
        time.sleep(0.01)
        return i


class ImageDataset(Dataset):
    """3x224x224 uint8 tensors, 16 made once and returned by index mod 16."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.images = [torch.full((3, 224, 224), k, dtype=torch.uint8) for k in range(16)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i % 16]


class IntDataset(Dataset):
    """The cheapest sample there is."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class StringDataset(Dataset):
    """A list of Python strings: each access writes the string's refcount."""

    def __init__(self, n: int) -> None:
        self.items = [f"sample-{i:08d}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> str:
        return self.items[i]


class SmallTensorDataset(Dataset):
    """Small float tensors, made on access."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))
