"""Which worker arena holds which batch, and when an arena is free again.

A batch from a worker process reaches the training loop without a copy: its tensors view the
shared arena the worker wrote them into (``shared_batch``). The arena is therefore busy
from the moment a batch is sent to a worker until the last tensor viewing it is freed, which
may be long after the loop moved on (a tensor kept in a list of outputs). ``ArenaLeases``
keeps that account for all the workers of a loader together:

- There are ``bound + allowance`` arenas. ``bound`` is torch's ``prefetch_factor *
  num_workers``: as under torch, no more batches than that are loading or waiting to be
  delivered; ``allowance`` more are for the batches the training loop holds (the one it
  works on, and the one it has just been given).
- Sending a batch takes a free arena, waiting for one while the pipeline is full. When no
  arena is free because the loop keeps *more* than ``allowance`` delivered batches alive,
  waiting would never end: the batch goes without an arena instead (pickled through the
  pipe, as with a start method other than fork), and the loop's hoard costs copies, not a
  hang.
- When an epoch ends early, every arena still busy counts as held: its batch may live on
  in what the epoch left behind, and the next epoch must not wait for it.
- An arena is free again when the batch viewing it is garbage (``release``, from a
  finalizer), or at once when its batch is discarded.
- The pages of an arena stay in memory after its batch is freed, ready for the next batch
  without a page fault; but only ``warm`` arenas keep them (one, in the loader: measured,
  the batches of 4 workers at 9.6 MB each cost 35 MiB more peak memory when every worker
  kept one warm), and only one of at most ``warm_bytes`` (``keeps_warm`` says): a warm
  arena is a batch torch's loader would not hold, and a script's batches of 256 images at
  224x224 (154 MB) kept the training process 79 MiB above torch's (issue 58), where the
  page faults it saves cost a few milliseconds beside a batch's seconds of decoding.
  Beyond that, an arena released gives its pages back (``cool``, a hole punched in the
  shared file) and is reused last. torch's loader makes fresh pages for every batch;
  without the limit, every arena would stay resident, and the loader would hold more
  batches' worth of memory than torch's.

The memory that batches take is then what torch's loader takes, and no private copy of a
batch exists beside its shared one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["NO_ARENA", "ArenaLeases"]

NO_ARENA = -1
"""What :meth:`ArenaLeases.take` returns when the batch should go without an arena."""


class ArenaLeases:
    """The free arenas of a loader's workers, and which batch each busy one holds."""

    def __init__(
        self,
        bound: int,
        allowance: int,
        warm: int,
        cool: Callable[[int], None],
        keeps_warm: Callable[[int], bool] = lambda arena: True,
    ) -> None:
        self.count = bound + allowance
        self.allowance = allowance
        self._warm_limit = warm
        self._cool = cool
        self._keeps_warm = keeps_warm
        self._warm: set[int] = set()  # arenas whose pages a batch has touched
        self._free = list(range(self.count - 1, -1, -1))  # popped from the end: 0 first
        self._batch_of: dict[int, int] = {}  # busy arena -> the batch it holds
        self._arena_of: dict[int, int] = {}  # batch of this epoch -> its arena
        self._held: set[int] = set()  # arenas of batches the training loop was given
        self._cond = threading.Condition()
        self._round = 0
        self.closed = False

    def take(self, b: int, block: bool = True) -> int | None:
        """An arena for batch ``b``; ``NO_ARENA`` when the training loop holds too many
        batches for one to come free (or, with ``block=False``, when none is free now);
        ``None`` when the epoch ended (``interrupt``) or the workers closed while waiting."""
        with self._cond:
            start = self._round
            while True:
                if self.closed or self._round != start:
                    return None
                if self._free:
                    arena = self._free.pop()
                    self._batch_of[arena] = b
                    self._arena_of[b] = arena
                    return arena
                if len(self._held) > self.allowance or not block:
                    return NO_ARENA
                self._cond.wait()

    def written(self, arena: int) -> None:
        """A batch was written into ``arena``: its pages are in memory."""
        with self._cond:
            self._warm.add(arena)

    def delivered(self, b: int) -> None:
        """The training loop was given batch ``b``: its arena (if still busy) counts as held."""
        with self._cond:
            arena = self._arena_of.pop(b, None)
            if arena is not None and self._batch_of.get(arena) == b:
                self._held.add(arena)
                self._cond.notify()  # a `take` may now go without an arena

    def release(self, arena: int) -> None:
        """``arena`` is free again (its batch is garbage, or was never read)."""
        with self._cond:
            b = self._batch_of.pop(arena, None)
            if b is None:
                return  # released already
            if self._arena_of.get(b) == arena:
                del self._arena_of[b]
            self._held.discard(arena)
            if arena in self._warm and (
                len(self._warm) > self._warm_limit or not self._keeps_warm(arena)
            ):
                self._warm.discard(arena)
                self._cool(arena)
                self._free.insert(0, arena)  # taken last: while warm ones are free
            else:
                self._free.append(arena)
            self._cond.notify()

    def interrupt(self) -> None:
        """The epoch ended: wake a ``take`` that waits, and forget this epoch's batch
        numbers (the next epoch counts from 0 again; arenas still busy stay busy)."""
        with self._cond:
            self._round += 1
            self._arena_of.clear()
            # A batch of the ended epoch that is still alive is somewhere the next epoch
            # cannot reach (a pipeline being torn down, a cycle that only the cycle
            # collector frees): it counts as held by the loop, so that the next epoch sends
            # without an arena rather than waiting for it (a persistent loader with early
            # breaks once waited forever here for batches only a gc.collect() freed).
            self._held.update(self._batch_of)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
