"""CPU time of a run's process tree, and of every other process of the machine meanwhile.

A benchmark's CPU figure must count the workers a loader starts and stops inside the timed
section, so :class:`CpuMeter` adds the process's own time, its reaped children's and the
children still alive at the end (``psutil``). The same meter reads the whole machine's busy
time (``/proc/stat``) over the section: less the run's own, that is another job's CPU
(``foreign_s``), which is what tells a run that other programs disturbed from a slow one
(``_reruns.py`` decides what to do about it; the threshold is here, beside the measure).

Why the threshold is a share and a floor: on a shared 2-core machine one import of torch
elsewhere (3 s of a core) made a 5-epoch training script 2 s slower and a single epoch of it
6 s long where it takes 0.8, while runs beside it took 0.0-0.2 s of foreign CPU. A run is
disturbed when others took more than :data:`FOREIGN_LIMIT` of its core-seconds and more
than :data:`FOREIGN_FLOOR_S` (a sub-second run meets 5% with the kernel's own housekeeping).
"""

from __future__ import annotations

import os
import resource

import psutil

FOREIGN_LIMIT = 0.05  # of a timed section's core-seconds, taken by other processes
FOREIGN_FLOOR_S = 0.1  # CPU-s of others below which no run counts as disturbed


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: all but
    idle and iowait); 0.0 where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_now(start_children: set[int]) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        if child.pid in start_children:
            continue
        try:
            t = child.cpu_times()
            live += t.user + t.system
        except psutil.Error:
            pass
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + live


class CpuMeter:
    """CPU seconds used by this process and its children between ``start()`` and ``stop()``,
    and by every other process of the machine meanwhile (``foreign_s``)."""

    last: CpuMeter | None = None  # the run's timed section: the last meter stopped

    def __init__(self) -> None:
        self._before = 0.0
        self._busy_before = 0.0
        self._known: set[int] = set()
        self.cpu_s = 0.0
        self.foreign_s = 0.0

    def start(self) -> None:
        self._known = {c.pid for c in psutil.Process().children(recursive=True)}
        self._busy_before = busy_cpu_s()
        self._before = _cpu_now(self._known)

    def stop(self) -> None:
        self.cpu_s = _cpu_now(self._known) - self._before
        self.foreign_s = max(0.0, busy_cpu_s() - self._busy_before - self.cpu_s)
        CpuMeter.last = self
