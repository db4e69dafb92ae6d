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

"Ran or waited for a core" is read from each of the worker's threads'
``/proc/self/task/<tid>/schedstat`` (time on a CPU, time runnable in a queue): the
batch's CPU time over all threads, plus the longest that any one thread waited, runnable,
for a core. All threads, because a staged dataset's ``io`` stages run on the worker's load
threads (``_loading/staged_batch.py``) and a decode there computes as much as one in
``__getitem__`` does while the main thread only waits for it. The longest wait and not
their sum, because the waits of several threads overlap: four load threads woken from
their reads on a busy machine queue for the same few milliseconds, which summed would
count a waiting worker as a computing one. Time lost to other runnable threads counts as
wanting the CPU, so a computing worker among many on few cores still raises its niceness.
Where those files are missing, the process's CPU time is used. On Linux a niceness is each
thread's own, so the raise is applied to every thread the worker has; threads it starts
later inherit it from the thread that starts them. Raising niceness needs no privilege;
where the system refuses it, the worker runs as it is.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["Priority"]

_TASKS = "/proc/self/task"

Clocks = dict[int, tuple[int, int]]  # thread id: (ns on a CPU, ns runnable in a queue)


def _clocks() -> Clocks | None:
    """Each thread's clocks, or None where ``/proc`` does not have them."""
    clocks: Clocks = {}
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as f:
                ran, queued, _ = f.read().split()
        except FileNotFoundError:  # a thread that ended since the listing
            continue
        except (OSError, ValueError):
            return None
        clocks[int(tid)] = int(ran), int(queued)
    return clocks


def _wanted_ns(before: Clocks, after: Clocks) -> int:
    """CPU time of every thread between two readings, plus the longest any one of them
    waited, runnable, for a core (a thread started between them counts from zero)."""
    ran = queued = 0
    for tid, (r, q) in after.items():
        r0, q0 = before.get(tid, (0, 0))
        ran += r - r0
        queued = max(queued, q - q0)
    return ran + queued


def _raise_niceness(by: int) -> None:
    """Add ``by`` to the niceness of every thread of this process (each thread's own)."""
    try:
        os.nice(by)  # this thread's
        tids = os.listdir(_TASKS)
    except OSError:
        return
    own = threading.get_native_id()
    for tid in map(int, tids):
        if tid == own:
            continue
        try:
            nice = min(os.getpriority(os.PRIO_PROCESS, tid) + by, 19)
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # ended since the listing, or refused
            continue


class Priority:
    """A worker's niceness: raised by ``nice`` once a batch shows the worker computes.

    Args:
        nice: what to add to the worker's niceness (0: never change it).
    """

    def __init__(self, nice: int) -> None:
        self._nice = nice
        self._raised = nice == 0
        self._since: tuple[int, Clocks | None, int] = (0, None, 0)  # wall, clocks, CPU

    def batch_begins(self) -> None:
        """Note where the worker's clocks stand as it takes a batch."""
        if not self._raised:
            self._since = (time.perf_counter_ns(), _clocks(), time.process_time_ns())

    def batch_ended(self) -> None:
        """Raise the niceness if the batch since :meth:`batch_begins` wanted a CPU for at
        least half its time."""
        if self._raised:
            return
        wall0, clocks0, cpu0 = self._since
        wall = time.perf_counter_ns() - wall0
        clocks = _clocks() if clocks0 is not None else None
        if clocks0 is not None and clocks is not None:
            wanted = _wanted_ns(clocks0, clocks)
        else:
            wanted = time.process_time_ns() - cpu0
        if 2 * wanted >= wall:
            self._raised = True
            _raise_niceness(self._nice)
