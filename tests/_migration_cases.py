"""Helpers for tests/test_migration.py: loading case modules, comparing batches."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

CASES = Path(__file__).resolve().parent / "migration_cases"

# case -> class -> stages the tool must report (None: kept as one stage)
EXPECTED: dict[str, dict[str, list[str] | None]] = {
    "image_folder": {"ImageFolderDataset": ["load (io)", "process (cpu)"]},
    "csv_labels": {"CsvImageDataset": ["load (io)", "process (cpu)"]},
    "hdf5_lazy": {"H5Dataset": ["load (io)", "process (cpu)"]},
    "numpy_memmap": {"WindowDataset": ["load (io)", "process (cpu)"]},
    "audio_pyav": {"AudioDataset": ["load (io)", "process (cpu)"]},
    "text_tokenizer": {"TextDataset": ["load (io)", "process (cpu)"]},
    "dict_samples": {"RecordDataset": ["load (io)", "process (cpu)"]},
    "tuple_samples": {"PairDataset": ["load (io)", "process (cpu)"]},
    "random_augment": {
        "AugmentedDataset": ["load (io)", "process (cpu)"],
        "SharedRngDataset": ["load (io)", "process (cpu)"],
    },
    "http_download": {"RemoteImageDataset": ["load (io)", "process (cpu)"]},
    "unsplittable": {"ClipDataset": None},
    "collate_sampler": {"SequenceDataset": ["load (io)", "process (cpu)"]},
    "torchvision_folder": {"ImageFolder": ["load (io)", "process (cpu)"], "DatasetFolder": None},
}


def load_module(path: Path, name: str) -> ModuleType:
    """Import a file as a fresh module (each case has a before, an after and a data)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # picklable classes for torch's worker processes
    spec.loader.exec_module(module)
    return module


def make_data(
    case: str, root: Path, stack: contextlib.ExitStack
) -> tuple[dict[str, Any], dict[str, int], int]:
    """The case's data under ``root``: (make_loader kwargs, {factory: torch_spdl workers},
    torch's workers)."""
    data = load_module(CASES / case / "data.py", f"_migration_{case}_data")
    kwargs = data.make_data(root, stack)
    return kwargs, getattr(data, "LOADERS", {"make_loader": 2}), getattr(data, "TORCH_WORKERS", 0)


def assert_same(a: Any, b: Any, where: str = "batch") -> None:
    """Exactly equal: same types, shapes, dtypes and values, recursively."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {a.keys()} != {b.keys()}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
