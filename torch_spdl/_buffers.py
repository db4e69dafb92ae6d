"""Batch buffers that are reused once nothing refers to them any more.

A batch of images is a large allocation (256 x 224 x 224 x 3 bytes is 38.5 MB). Allocated
fresh for every batch, its pages are faulted in (and zeroed by the kernel) every time,
which here costs more than copying the frames into it. A pool hands out the same few
buffers again: a buffer is free when its reference count is back to the pool's own, that
is when the consumer has dropped every array, view and tensor made from it
(``torch.from_numpy`` keeps a reference to the array for as long as the tensor lives).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Up to ``max_buffers`` reusable arrays of each (shape, dtype).

    Thread-safe. :meth:`take` returns a free pooled array, a new pooled one while fewer
    than ``max_buffers`` of that kind exist, else None (the caller allocates as usual).
    The memory comes from torch's allocator, so ``torch_spdl.io.to_torch`` views it without a copy
    (NumPy would ask for transparent huge pages, measured several times slower to fault in
    on the development machine).
    """

    def __init__(self, max_buffers: int = 4) -> None:
        if max_buffers < 1:
            raise ValueError(f"max_buffers must be >= 1, got {max_buffers!r}")
        self.max_buffers = max_buffers
        self._buffers: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray | None:
        """A buffer of ``shape`` and ``dtype`` that nobody else uses, or None."""
        dt = np.dtype(dtype)
        key = (tuple(shape), dt.str)
        with self._lock:
            buffers = self._buffers.setdefault(key, [])
            for array in buffers:
                # References: the list, the loop variable and getrefcount's argument.
                if sys.getrefcount(array) <= 3:
                    return array
            if len(buffers) >= self.max_buffers:
                return None
            array = _allocate(key[0], dt)
            buffers.append(array)
            return array

    def __len__(self) -> int:
        """How many buffers the pool holds (free or in use)."""
        with self._lock:
            return sum(len(b) for b in self._buffers.values())


def _allocate(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    import torch

    try:
        return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).numpy()
    except TypeError:  # a dtype torch has no twin for
        return np.empty(shape, dtype)
