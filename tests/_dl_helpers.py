"""Module-level (so picklable) datasets, callables and checks for the tests/test_dataloader_*.py
files."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch
from _sync import WAIT
from torch.utils.data import Dataset, IterableDataset

N = 23  # samples in the matrix datasets (odd, so drop_last matters)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class VarBatchSampler:
    """A batch sampler with variable batch sizes (1, 2, 3, 4, 1, 2, ...) over a permutation."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed

    def _batches(self) -> list[list[int]]:
        order = torch.randperm(self.n, generator=gen(self.seed)).tolist()
        out, size = [], 1
        while order:
            out.append(order[:size])
            order = order[size:]
            size = size % 4 + 1
        return out

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("torch_spdl")]


def assert_no_pipeline_threads() -> None:
    for t in pipeline_threads():
        t.join(timeout=WAIT)
    assert not [t.name for t in pipeline_threads()]


def ids(batches: list[torch.Tensor]) -> list[list[int]]:
    """Batches of int samples (collated to 1-d tensors) as lists of indices."""
    return [b.tolist() for b in batches]


def make_sample(i: int, kind: str) -> Any:
    """Sample ``i`` as a tensor, a dict, a tuple or a plain int."""
    if kind == "tensor":
        return torch.arange(3, dtype=torch.float32) + 10 * i
    if kind == "dict":
        return {"x": torch.full((2,), float(i)), "y": i, "name": f"s{i}"}
    if kind == "tuple":
        return (torch.tensor([i, -i]), i * 0.5)
    if kind == "int":
        return i
    raise ValueError(kind)


class MapData(Dataset):
    """Map-style dataset of ``n`` samples of the given kind."""

    def __init__(self, n: int, kind: str = "tensor") -> None:
        self.n = n
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return make_sample(int(i), self.kind)


class IterData(IterableDataset):
    """Iterable dataset of ``n`` samples of the given kind (with ``__len__``)."""

    def __init__(self, n: int, kind: str = "tensor") -> None:
        self.n = n
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield make_sample(i, self.kind)


class ShardedByWorker(IterableDataset):
    """Reads ``range(n)``, each worker its own share (``torch.utils.data.get_worker_info``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


def list_collate(samples: list[Any]) -> Any:
    """A custom collate_fn: keeps the samples, tagged, so the batch structure is visible."""
    return {"n": len(samples), "samples": list(samples)}


def single_collate(sample: Any) -> Any:
    """A custom collate_fn for ``batch_size=None`` (gets one sample)."""
    return ("one", sample)


class ProcessData(Dataset):
    """Picklable dataset for ``worker_type="process"``: records the pid that read it."""

    def __init__(self, n: int, with_pid: bool = False) -> None:
        self.n = n
        self.with_pid = with_pid

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        sample = {"x": torch.arange(4) * i, "i": i}
        if self.with_pid:
            sample["pid"] = os.getpid()
        return sample


class ProcessBadData(ProcessData):
    """Fails on index ``bad`` with a ``KeyError`` (raised in the worker process)."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> Any:
        if i == self.bad:
            raise KeyError(f"no sample {i}")
        return super().__getitem__(i)


class ProcessWorkerInfoData(Dataset):
    """Returns what ``torch_spdl.get_worker_info()`` and the init hook saw in the worker."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch_spdl

        info = torch_spdl.get_worker_info()
        return {
            "i": i,
            "has_info": info is not None,
            "init_ran": os.environ.get("_DL_HELPERS_INIT_RAN", "") == str(os.getpid()),
        }


def mark_init(worker_id: int) -> None:
    """worker_init_fn for process workers: leaves a mark the dataset can read."""
    os.environ["_DL_HELPERS_INIT_RAN"] = str(os.getpid())


def assert_same(ours: Any, ref: Any, path: str = "batch") -> None:
    """Exact structural equality: same types, same keys, equal tensors (dtype and shape)."""
    assert type(ours) is type(ref), f"{path}: {type(ours).__name__} != {type(ref).__name__}"
    if isinstance(ref, torch.Tensor):
        assert ours.dtype == ref.dtype, f"{path}: dtype {ours.dtype} != {ref.dtype}"
        assert ours.shape == ref.shape, f"{path}: shape {ours.shape} != {ref.shape}"
        assert torch.equal(ours, ref), f"{path}: {ours} != {ref}"
    elif isinstance(ref, dict):
        assert list(ours) == list(ref), f"{path}: keys {list(ours)} != {list(ref)}"
        for key in ref:
            assert_same(ours[key], ref[key], f"{path}[{key!r}]")
    elif isinstance(ref, (list, tuple)):
        assert len(ours) == len(ref), f"{path}: len {len(ours)} != {len(ref)}"
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == ref, f"{path}: {ours!r} != {ref!r}"


def assert_same_batches(ours: list[Any], ref: list[Any]) -> None:
    assert len(ours) == len(ref), f"{len(ours)} batches, torch gives {len(ref)}"
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert_same(a, b, f"batch {i}")
