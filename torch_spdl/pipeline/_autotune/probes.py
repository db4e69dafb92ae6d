"""What the autotuner reads about the process: cores, CPU time, resident memory.

Kept apart from the decision rules (which read nothing) and from the sampler thread (which
reads stages), because these are the only calls that depend on the operating system, and
each has a fallback where the OS lacks the precise source.
"""

from __future__ import annotations

import os
import time

__all__ = ["cpu_count", "process_cpu_seconds", "read_rss"]


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def process_cpu_seconds() -> float:
    """CPU seconds used by the whole process so far, to the nanosecond where the OS can.

    ``time.process_time`` reads ``CLOCK_PROCESS_CPUTIME_ID``; ``os.times`` counts in clock
    ticks (10 ms on Linux), too coarse for the first ticks of the tuner (10 ms each).
    """
    return time.process_time()


def read_rss() -> int | None:
    """Resident memory of this process in bytes (``/proc/self/statm``; else peak RSS)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return None
