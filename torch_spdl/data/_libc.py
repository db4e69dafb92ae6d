"""Two requests to the C allocator that keep worker processes as small as torch's.

Both are glibc's (``mallopt``, ``malloc_trim``); with another C library they do nothing.

- Before the workers are forked: give back the pages that free memory holds. Whatever the
  loader's process holds at that moment, every worker inherits; free memory inside the
  allocator's per-thread arenas (left, for example, by the threads that measured the first
  batches when ``worker_type="auto"`` chose processes) is never touched again but stays
  resident, and its pages are counted in every process that maps them.
- Give a block of 1 MiB or more back to the system as soon as it is freed, in worker
  processes and in the loader's process once an epoch with workers starts. glibc serves
  such blocks with their own mappings at first, but raises that threshold each time one is
  freed (up to 32 MiB); from then on every batch-sized block comes from a heap, and with
  several threads from several heaps (one per thread), which keep freed batches resident
  and are never trimmed. Measured, 3x224x224 batches of 128 on 4 loading threads: peak
  PSS 525-543 MiB with glibc's sliding threshold, 402-420 MiB with it fixed at 1 MiB
  (torch: 437), at the same rate. It is process-wide and glibc's own starting behaviour;
  ``TORCH_SPDL_MALLOC_TUNING=0`` leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["return_large_blocks", "trim"]

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def _libc_function(name: str) -> Any:
    if os.environ.get("TORCH_SPDL_MALLOC_TUNING") == "0":
        return None
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
