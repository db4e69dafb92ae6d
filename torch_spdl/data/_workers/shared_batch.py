"""How a batch crosses from a worker process to the loader: metadata pickled, tensors in
shared memory that is made once and reused, and handed to the training loop without a copy.

torch's worker processes move every tensor of every batch into a new shared-memory segment
and pass its file descriptor through a helper thread: a new mapping, fresh pages and a
descriptor hand-off per tensor per batch. Here the loader owns a few *arenas*, one per batch
that may exist at once (``arena_leases``); an arena is an anonymous shared file (``memfd``) that
the loader and every worker have mapped since the fork. The worker pickles the batch with
every tensor replaced by a reference to where it copied the tensor's bytes in the arena; the
loader unpickles it into tensors that *view* the arena, so the batch exists once, in shared
memory, as under torch. When the last of those tensors is freed, a finalizer gives the arena
back for another batch. Only the references and the non-tensor parts of the batch are
pickled.

An arena grows when a batch does not fit: the worker enlarges the file and maps it again,
and the reply says the new size, so the loader maps it again too. Nothing is ever named in
``/dev/shm``: the files vanish with the last process holding them, even after a crash, and a
mapping that tensors still view outlives its file descriptor until they are freed.

Without ``fork`` (a ``spawn`` or ``forkserver`` context) the file cannot be inherited, and
batches travel by value through the pipe instead (as does a batch sent when no arena is
free).
"""

from __future__ import annotations

import copyreg
import functools
import io
import math
import mmap
import os
import pickle
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["Arena", "BatchSpace", "dump_batch", "load_batch"]

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
        self._unmap()
        self._map = mmap.mmap(self.fd, size)
        self.size = size

    def _unmap(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # tensors still view it: unmapped when they are freed
                pass
            self._map = None

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the arena at ``offset`` as a flat uint8 tensor (no copy)."""
        assert self._map is not None
        return torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=offset)

    def cool(self) -> None:
        """Give the file's pages back to the system (they are zero when next touched)."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_REMOVE)

    def lend(self, nbytes: int) -> np.ndarray:
        """The arena's first ``nbytes`` as an array that tensors may view (no copy); the
        mapping stays valid while any of them lives."""
        assert self._map is not None
        return np.frombuffer(self._map, dtype=np.uint8, count=nbytes)

    def close(self) -> None:
        self._unmap()
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


class BatchSpace:
    """Room for one batch in an arena, handed out front to back: a worker's collate stacks
    large tensors straight into it (:meth:`empty`), so that :func:`dump_batch` has
    nothing to copy for them. torch's workers collate into shared memory the same way."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.end = 0
        self._made: dict[int, tuple[int, int]] = {}  # data pointer -> (offset, bytes)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in the arena (None for a dtype of no fixed size)."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not nbytes:
            return None
        offset = self.end
        self.end = _aligned(offset + nbytes)
        self.arena.ensure(self.end)  # a growth maps the file again: earlier views stay valid
        out = self.arena.view(offset, nbytes).view(dtype).view(shape)
        self._made[out.data_ptr()] = (offset, nbytes)
        return out

    def offset_of(self, t: torch.Tensor, nbytes: int) -> int | None:
        """Where ``t`` lies in the arena, if :meth:`empty` made it (whole, unchanged)."""
        made = self._made.get(t.data_ptr())
        if made is None or made[1] != nbytes or not t.is_contiguous():
            return None
        return made[0]


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Placement:
    """Where a batch's tensors go in the arena (``placed``: ``(offset, tensor)``, copied
    there once the arena is large enough), unless the batch's ``space`` holds them
    already. It refers to no pickler, so a pickler whose table holds :meth:`reduce` is
    freed by its reference count alone."""

    def __init__(self, space: BatchSpace | None) -> None:
        self.placed: list[tuple[int, torch.Tensor]] = []
        self.space = space
        self.end = space.end if space is not None else 0

    def reduce(self, obj: torch.Tensor) -> Any:
        nbytes = obj.numel() * obj.element_size() if _shareable(obj) else 0
        if not nbytes:  # pickled by value, as torch pickles it (an empty one is small)
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        where = self.space.offset_of(obj, nbytes) if self.space is not None else None
        if where is None:
            where = self.end
            self.end = _aligned(where + nbytes)
            self.placed.append((where, obj))
        return _arena_tensor, (where, nbytes, obj.dtype, tuple(obj.shape))


def _arena_tensor(offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
    """Names a tensor's place in an arena inside a batch's pickle; :func:`load_batch`
    reads it as a view of the arena, and nothing else can."""
    raise pickle.UnpicklingError("a batch written into an arena is read by load_batch only")


def _writer(file: io.BytesIO, placement: _Placement) -> pickle.Pickler:
    """A pickler that gives every plain CPU tensor its place in the arena. The tensors are
    found by the pickler's table of reductions, which the C pickler looks up by exact
    type: only tensors call back into Python. (A ``persistent_id`` is called for every
    object: 256 path strings took 33 us to pickle with one, 9 us with this table, 6 us
    with no hook at all.)"""
    writer = pickle.Pickler(file, protocol=pickle.HIGHEST_PROTOCOL)
    table = dict(copyreg.dispatch_table)
    table[torch.Tensor] = placement.reduce
    writer.dispatch_table = table
    return writer


def dump_batch(
    batch: Any, arena: Arena | None, space: BatchSpace | None = None
) -> tuple[bytes, int, int]:
    """Pickle ``batch`` for the loader; with an arena, its tensors' bytes go there (those
    that ``space``, the batch's room in that arena, holds already stay where they are).

    Returns the pickle, the arena's size (the loader maps it again if it grew) and the bytes
    of it the batch uses."""
    if arena is None:
        return pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), 0, 0
    buf = io.BytesIO()
    placement = _Placement(space)
    _writer(buf, placement).dump(batch)
    arena.ensure(placement.end)
    for offset, t in placement.placed:
        arena.view(offset, t.numel() * t.element_size()).copy_(_flat_bytes(t))
    return buf.getvalue(), arena.size, placement.end


def _view(base: np.ndarray, offset: int, nbytes: int, dtype: torch.dtype, shape: Any) -> Any:
    flat = torch.from_numpy(base[offset : offset + nbytes])
    return flat.view(dtype).view(shape)


class _Reader(pickle.Unpickler):
    """Reads :func:`_arena_tensor` as a view of ``base``, through a partial that refers to
    ``base`` only, so that nothing holds ``base`` once the reader and the batch are gone."""

    def __init__(self, data: bytes, base: np.ndarray) -> None:
        super().__init__(io.BytesIO(data))
        self._arena_tensor = functools.partial(_view, base)

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_arena_tensor":
            return self._arena_tensor
        return super().find_class(module, name)


def load_batch(
    data: bytes, arena: Arena | None, size: int, used: int, release: Callable[[], None]
) -> Any:
    """The batch :func:`dump_batch` made, its tensors viewing the arena's first ``used``
    bytes; ``release`` is called once none of them is left (at once if there are none)."""
    if arena is None:
        release()
        return pickle.loads(data)
    arena.remap(size)
    if not used:  # nothing of the batch is in the arena
        release()
        return pickle.loads(data)
    base = arena.lend(used)
    weakref.finalize(base, release)
    try:
        return _Reader(data, base).load()
    finally:
        del base  # the batch's tensors keep it (and the arena) alive, nothing else
