"""Batch buffers that are reused once nothing refers to them any more.

A batch of images is a large allocation (256 x 224 x 224 x 3 bytes is 38.5 MB). Allocated
fresh for every batch, its pages are faulted in (and zeroed by the kernel) every time,
which here costs more than copying the frames into it. A pool hands out the same few
buffers again: a buffer is free once the consumer has dropped every array, view and tensor
made from what :meth:`BufferPool.take` handed out.

How the pool knows, without counting references (CPython does not promise how many it
holds itself): each ``take`` hands out a fresh array whose base is a small lease object
over the pooled memory, not an array. NumPy collapses a view's base only through arrays,
so every view made from the handed-out array keeps that array, and so the lease, alive;
``torch.from_numpy`` keeps the array alive for as long as any tensor made from it lives.
The callback of a weak reference to the lease therefore runs exactly when the last of them
is gone, and marks the buffer free. (The lease also keeps the memory itself alive, should
the pool go first.)
"""

from __future__ import annotations

import threading
import weakref
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
        self._buffers: dict[tuple[tuple[int, ...], str], list[_Slot]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray | None:
        """A buffer of ``shape`` and ``dtype`` that nobody else uses, or None (also for an
        object dtype, which has no raw memory to share)."""
        dt = np.dtype(dtype)
        if dt.hasobject:
            return None
        key = (tuple(shape), dt.str)
        with self._lock:
            slots = self._buffers.setdefault(key, [])
            slot = next((s for s in slots if s.free), None)
            if slot is None:
                if len(slots) >= self.max_buffers:
                    return None
                slot = _Slot(_allocate(key[0], dt))
                slots.append(slot)
            slot.free = False
        return slot.hand_out()

    def __len__(self) -> int:
        """How many buffers the pool holds (free or in use)."""
        with self._lock:
            return sum(len(b) for b in self._buffers.values())


class _Slot:
    """One pooled buffer, and whether everything made from its last hand-out is gone."""

    __slots__ = ("memory", "free", "_lease")

    def __init__(self, memory: np.ndarray) -> None:
        self.memory = memory
        self.free = True
        self._lease: weakref.ref[_Lease] | None = None

    def hand_out(self) -> np.ndarray:
        lease = _Lease(self.memory)
        # The callback runs when the lease is collected. It is a plain attribute store, no
        # lock: it may run inside take() (a garbage collection there) without deadlocking on
        # the pool's lock.
        self._lease = weakref.ref(lease, self._release)
        return np.asarray(lease)

    def _release(self, _: weakref.ref[_Lease]) -> None:
        self.free = True


class _Lease:
    """Exposes the pooled memory through the array interface, so that the array NumPy makes
    from it has this lease, not an array, as its base."""

    __slots__ = ("memory", "__array_interface__", "__weakref__")

    def __init__(self, memory: np.ndarray) -> None:
        self.memory = memory
        self.__array_interface__ = memory.__array_interface__


def _allocate(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    import torch

    try:
        return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).numpy()
    except TypeError:  # a dtype torch has no twin for
        return np.empty(shape, dtype)
