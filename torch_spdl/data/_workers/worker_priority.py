"""When a worker process yields the cores to the training loop: once it computes.

A worker only prepares batches ahead, while a training step stalls whenever one of its
threads loses its core (its other intra-op threads wait at the next barrier). With a
higher niceness the scheduler runs the worker in what the training process leaves, and
rarely preempts a training thread to wake it. Measured on 2 cores with a small CNN
training, by ``benchmarks/swap.py`` (7 runs a side, against torch's loader): niceness 0
gave 1.00x on 3x224x224 images with 4 workers and 1.03x on JPEG files with 2, niceness 10
gave 1.13x and 1.17x.

The same niceness costs a worker that mostly waits (a read, a remote call): each time its
wait ends it queues behind the training threads for a core, a few hundred microseconds a
sample that add up on the epoch's critical path (10 ms reads, 2 workers, a CNN training,
4 runs each: from the first batch to the last, 1,981-1,998 ms at niceness 10, 1,964-1,989
ms at 0, 1,962-1,978 ms with torch's loader). Such a worker takes little from the
training loop either way. So a worker starts at the loader's niceness and raises its own
by ``worker_nice`` after the first batch for which it ran, or waited for a core, at least
half of the batch's time; a worker whose batches are waits keeps the loader's niceness.
The decision is one-way (lowering niceness again needs a privilege) and each worker's
own; a worker of a later epoch decides afresh.

"Ran or waited for a core" is the thread's ``/proc/thread-self/schedstat`` (time on a
CPU plus time runnable in a queue): time lost to other runnable threads counts as wanting
the CPU, so a computing worker among many on few cores still raises its niceness. Where
that file is missing, the thread's CPU time alone is used. Raising niceness needs no
privilege; where the system refuses it, the worker runs as it is.
"""

from __future__ import annotations

import os
import time

__all__ = ["Priority"]

_SCHEDSTAT = "/proc/thread-self/schedstat"


def _wanted_ns() -> int:
    """Nanoseconds the calling thread ran on a CPU or waited, runnable, for one."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            ran, queued, _ = f.read().split()
        return int(ran) + int(queued)
    except (OSError, ValueError):
        return time.thread_time_ns()


class Priority:
    """A worker's niceness: raised by ``nice`` once a batch shows the worker computes.

    Args:
        nice: what to add to the worker's niceness (0: never change it).
    """

    def __init__(self, nice: int) -> None:
        self._nice = nice
        self._raised = nice == 0
        self._since = (0, 0)

    def batch_begins(self) -> None:
        """Note where the worker's clocks stand as it takes a batch."""
        if not self._raised:
            self._since = (time.perf_counter_ns(), _wanted_ns())

    def batch_ended(self) -> None:
        """Raise the niceness if the batch since :meth:`batch_begins` wanted a CPU for at
        least half its time."""
        if self._raised:
            return
        wall = time.perf_counter_ns() - self._since[0]
        if 2 * (_wanted_ns() - self._since[1]) >= wall:
            self._raised = True
            try:
                os.nice(self._nice)
            except OSError:
                pass
