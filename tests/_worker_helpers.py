"""Module-level datasets for tests/test_worker_processes.py: the kinds of ``__getitem__``
the loader must run as well as torch does (pure Python, small NumPy ops, random draws,
I/O waits), and ones that misbehave in a worker process."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from torch_spdl import StagedDataset

_WORDS = re.compile(r"\w+|[^\w\s]")


class Tokens(Dataset):
    """A word-level tokenizer in pure Python (holds the GIL)."""

    def __init__(self, n: int, length: int = 16) -> None:
        self.n = n
        self.length = length
        self.vocab = {f"w{i}": i + 2 for i in range(50)}
        self.texts = [" ".join(f"W{(i * 7 + j) % 60}, x." for j in range(8)) for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = [self.vocab.get(w.lower(), 1) for w in _WORDS.findall(self.texts[i])]
        ids = (ids + [0] * self.length)[: self.length]
        return {"ids": torch.tensor(ids), "n": len(ids), "text": self.texts[i][:5]}


class SmallArrays(Dataset):
    """A chain of small NumPy ops on a 16x16 crop."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.image = np.arange(24 * 24, dtype=np.float32).reshape(24, 24) / 100

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.image[i % 8 : i % 8 + 16, 2:18]
        x = x[:, ::-1] if i % 2 else x
        x = (x - x.mean()) / (x.std() + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(np.clip(x, -2, 2)))


class RandomDraws(Dataset):
    """Draws from torch, ``random`` and NumPy in the worker: equal to torch's only if the
    workers are seeded as torch seeds them and get the same batches."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "i": i,
            "torch": torch.rand(2),
            "random": random.random(),
            "numpy": float(np.random.rand()),
        }


class TorchWorkerInfo(Dataset):
    """What ``torch.utils.data.get_worker_info()`` says in the worker."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        return {"i": i, "id": info.id, "num_workers": info.num_workers, "seed": info.seed}


class Waits(Dataset):
    """Every sample waits (I/O)."""

    def __init__(self, n: int, seconds: float = 0.002) -> None:
        self.n = n
        self.seconds = seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.seconds)
        return i


class Dies(Dataset):
    """The worker process that loads sample ``bad`` dies: killed, or ``os._exit(code)``."""

    def __init__(self, n: int, bad: int, how: str, code: int = 3) -> None:
        self.n = n
        self.bad = bad
        self.how = how
        self.code = code
        self.parent = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad and os.getpid() != self.parent:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(self.code)
        return i


class Stuck(Dataset):
    """Sample ``bad`` never returns (in a worker process)."""

    def __init__(self, n: int, bad: int) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            time.sleep(3600)
        return i


class Staged(StagedDataset):
    """``load`` records the pid it ran in, ``process`` too."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> dict[str, Any]:
        return {"i": i, "load_pid": os.getpid()}

    def process(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {**raw, "x": torch.full((2,), float(raw["i"])), "process_pid": os.getpid()}


def failing_init(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


def stuck_init(worker_id: int) -> None:
    """A ``worker_init_fn`` that never returns (in a worker process)."""
    threading.Event().wait()


class Keyed(Dataset):
    """Samples by long string keys: a batch of keys is a large task to send."""

    def __getitem__(self, key: str) -> int:
        return len(key)


def long_key_batches(n: int, per_batch: int) -> list[list[str]]:
    """Batches of keys whose pickled task is larger than a pipe holds (64 KiB)."""
    return [[f"{b:04d}-{i:05d}-" + "k" * 60 for i in range(per_batch)] for b in range(n)]
