"""Two requests to the C allocator that keep worker processes as small as torch's.

Both are glibc's (``mallopt``, ``malloc_trim``); with another C library they do nothing.

- Before the workers are forked: give back the pages that free memory holds. Whatever the
  loader's process holds at that moment, every worker inherits; free memory inside the
  allocator's per-thread arenas (left, for example, by the threads that measured the first
  batches when ``worker_type="auto"`` chose processes) is never touched again but stays
  resident, and its pages are counted in every process that maps them.
- In a worker: give a block of 1 MiB or more back to the system as soon as it is freed.
  glibc raises that threshold as large blocks come and go, after which each batch the
  worker collates (and then copies into a shared arena) grows a heap that is never
  trimmed: megabytes per worker that torch's workers, which collate straight into shared
  memory, do not keep.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["return_large_blocks", "trim"]

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def _libc_function(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def trim() -> None:
    """Return the free pages of every allocator arena to the system."""
    fn = _libc_function("malloc_trim")
    if fn is not None:
        fn(0)


def return_large_blocks() -> None:
    """Serve (and free) blocks of 1 MiB or more with their own mappings from now on."""
    fn = _libc_function("mallopt")
    if fn is not None:
        fn(_M_MMAP_THRESHOLD, 1 << 20)
