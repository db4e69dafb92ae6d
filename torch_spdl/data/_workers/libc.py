"""Requests to the C allocator, made only where the loader owns the process.

Both are glibc's (``mallopt``, ``malloc_trim``); with another C library they do nothing.
Neither is ever made process-wide in the training process as a setting: the training step
allocates activations and gradients over 1 MiB every step, and a fixed mmap threshold made
each of them a fresh mapping (whole training runs 1.3-2.7x slower; docs/dataloader.md,
"Memory").

- :func:`trim`: give back the pages that free memory holds. An action, not a setting,
  made at two points. Before worker processes are forked after ``worker_type="auto"``
  measured on threads: whatever the loader's process holds then, every worker inherits.
  And in a worker process, after each staged dataset's batch whose loads ran on its
  threads (below).
- :func:`return_large_blocks`: in a worker process (the loader's own, running no training
  code), give a block of 1 MiB or more back to the system as soon as it is freed. glibc
  serves such blocks with their own mappings at first but raises that threshold each time
  one is freed (up to 32 MiB), after which batch-sized blocks come from heaps that keep
  freed batches resident.
- :func:`share_arenas`: in a worker process, let its threads share two allocator arenas
  instead of one each (glibc's default allows 8 per core). A staged dataset's load
  threads (a batch's worth, up to 64) each took an arena of their own, and each arena
  kept the high-water mark of the file bytes its thread read: superres split by migrate
  and ImageFolder staged, on the latency store, had peak PSS 3-7% above torch's; with one
  shared arena, at torch's (``benchmarks/real_scripts.py``, 2026-12-02). The threads wait
  on storage, not on the allocator's lock. The cap bounds the arenas the worker makes: a
  forked worker also inherits those its parent made before the fork, and glibc hands them
  to new threads first (no call gives them back).

A worker trims after a staged batch because a forked worker inherits every arena its
parent made (the arena cap cannot lower their number) and its load threads reuse them: the
bytes a batch's loads held end up free between chunks that stay allocated, resident until
a trim. On the latency store the migrated superres kept peak PSS 4.9% above torch's with
the cap alone, +0.5% with a trim after each batch (``benchmarks/real_scripts.py --only
superres``, 2026-12-03). A trim that finds nothing to give back costs a few microseconds,
one that does about 0.2 ms (16 threads' worth of freed blocks), against staged batches of
milliseconds; it runs after every such batch, not on a timer, so what a batch leaves
resident does not depend on the machine's speed. Not after a batch whose loads ran
inline (``_loading/staged_batch.py``): they ran on the worker's main thread, in its own
arena, as ``__getitem__`` does, and a trim there only gave back pages the next batch
faulted in again: 0.4-0.7 ms a trim and a migrated detection script's loader 30%
slower than the swap's on local files, 0.36-0.49 s an epoch against 0.28-0.31 (one-off,
2026-12-04).

``TORCH_SPDL_MALLOC_TUNING=0`` leaves the workers' allocator alone.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["return_large_blocks", "share_arenas", "trim"]

_M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers (glibc's malloc.h)
_M_ARENA_MAX = -8
_WORKER_ARENAS = 2  # the main thread's, and one for every other thread


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


def share_arenas() -> None:
    """Give the threads started from now on at most ``_WORKER_ARENAS`` arenas in all."""
    fn = _libc_function("mallopt")
    if fn is not None:
        fn(_M_ARENA_MAX, _WORKER_ARENAS)
