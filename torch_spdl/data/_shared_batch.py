"""How a batch crosses from a worker process to the loader: metadata pickled, tensors in
shared memory that is made once and reused.

torch's worker processes move every tensor of every batch into a new shared-memory segment
and pass its file descriptor through a helper thread: a new mapping, fresh pages and a
descriptor hand-off per tensor per batch. Here each worker owns a few *arenas*, one per
batch it may have in flight; an arena is an anonymous shared file (``memfd``) that both
processes have mapped since the fork. The worker pickles the batch with every tensor replaced
by a reference to where it copied the tensor's bytes in its arena; the loader unpickles it,
copying each tensor out of the arena, and the arena is free for the worker's next batch.
Only the references and the non-tensor parts of the batch are pickled.

An arena grows when a batch does not fit: the worker enlarges the file and maps it again,
and the reply says the new size, so the loader maps it again too. Nothing is ever named in
``/dev/shm``: the files vanish with the last process holding them, even after a crash.

Without ``fork`` (a ``spawn`` or ``forkserver`` context) the file cannot be inherited, and
batches travel by value through the pipe instead.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
from typing import Any

import torch

from ._collate import MIN_POOLED_BYTES, TensorPool

__all__ = ["Arena", "dump_batch", "load_batch"]

_ALIGN = 64


class Arena:
    """A growable shared-memory file, mapped in this process."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("torch_spdl-batch", os.MFD_CLOEXEC)
        self.size = 0
        self._map: mmap.mmap | None = None

    def ensure(self, size: int) -> None:
        """Make the file at least ``size`` bytes (worker side) and map it."""
        if size > self.size:
            size = max(size, 2 * self.size, 1 << 16)
            os.ftruncate(self.fd, size)
            self.remap(size)

    def remap(self, size: int) -> None:
        """Map the file again after it grew to ``size`` bytes (either side)."""
        if size == 0 or (size == self.size and self._map is not None):
            return  # nothing written yet, or already mapped at this size
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self.fd, size)
        self.size = size

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the arena at ``offset`` as a flat uint8 tensor (no copy)."""
        assert self._map is not None
        return torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=offset)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _shareable(obj: Any) -> bool:
    return (
        type(obj) is torch.Tensor
        and obj.layout is torch.strided
        and obj.device.type == "cpu"
        and not obj.requires_grad
        and not obj.is_quantized
    )


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


class _Writer(pickle.Pickler):
    """Pickles a batch, giving each plain CPU tensor its place in the arena (``placed``:
    ``(offset, tensor)``, copied there once the arena is large enough)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.placed: list[tuple[int, torch.Tensor]] = []
        self.end = 0

    def persistent_id(self, obj: Any) -> Any:
        if not _shareable(obj):
            return None
        nbytes = obj.numel() * obj.element_size()
        offset = self.end
        self.end = -(-(offset + nbytes) // _ALIGN) * _ALIGN
        self.placed.append((offset, obj))
        return ("tensor", offset, nbytes, obj.dtype, tuple(obj.shape))


def dump_batch(batch: Any, arena: Arena | None) -> tuple[bytes, int]:
    """Pickle ``batch`` for the loader; with an arena, its tensors' bytes go there.

    Returns the pickle and the arena's size (the loader maps it again if it grew)."""
    if arena is None:
        return pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), 0
    buf = io.BytesIO()
    writer = _Writer(buf)
    writer.dump(batch)
    arena.ensure(writer.end)
    for offset, t in writer.placed:
        nbytes = t.numel() * t.element_size()
        if nbytes:
            arena.view(offset, nbytes).copy_(_flat_bytes(t))
    return buf.getvalue(), arena.size


class _Reader(pickle.Unpickler):
    def __init__(self, data: bytes, arena: Arena, pool: TensorPool | None) -> None:
        super().__init__(io.BytesIO(data))
        self._arena = arena
        self._pool = pool

    def persistent_load(self, pid: Any) -> Any:
        _, offset, nbytes, dtype, shape = pid
        out = None
        if self._pool is not None and nbytes >= MIN_POOLED_BYTES:
            out = self._pool.take(shape, dtype)
        if out is None:
            out = torch.empty(shape, dtype=dtype)
        if nbytes:
            out.reshape(-1).view(torch.uint8).copy_(self._arena.view(offset, nbytes))
        return out


def load_batch(data: bytes, arena: Arena | None, size: int, pool: TensorPool | None) -> Any:
    """The batch :func:`dump_batch` made, its tensors copied out of the arena (which is
    then free for the worker's next batch)."""
    if arena is None:
        return pickle.loads(data)
    arena.remap(size)
    return _Reader(data, arena, pool).load()
