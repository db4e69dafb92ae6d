"""The CPU and memory of a process tree, by who started each process and the core it is
pinned to: what ``ray_offload.py`` counts for each contender.

Why a class per process and not one total: the trainer, torch's workers and Ray's daemons
share a machine here, each pinned to a core, and a contender's cost is what its processes
used, wherever they ran: torch's workers live under its forkserver, Ray's daemons and
actors under the processes the cluster started, and an idle cluster must not be charged to
torch. A process's CPU is user + system + its reaped children's, so a worker that exited
between two snapshots still counts (its parent reaped it).
"""

from __future__ import annotations

import os

import psutil
from _measure import pss_kb

AGENTS = ("IDLE", "DashboardAgent", "RuntimeEnvAgent")  # Ray's own, on every node
TICK = os.sysconf("SC_CLK_TCK")


class Tree:
    """The trainer and its descendants, each classed ``trainer``, ``local`` (under a direct
    child that the cluster did not start: torch's forkserver and the workers it forks) or
    ``ray``, and by its cores."""

    def __init__(self, ray_roots: set[int]) -> None:
        self.me, self.ray_roots = psutil.Process(), ray_roots

    def snapshot(self) -> dict[int, tuple[float, str, str]]:
        """pid -> (CPU seconds so far, ``class@cores``, its title)."""
        snap, me, top = {}, self.me.pid, {}  # top: pid -> its ancestor that is my child
        for p in [self.me, *self.me.children(recursive=True)]:  # parents before children
            try:
                parent = p.ppid()
                top[p.pid] = p.pid if parent == me else top.get(parent, parent)
                kind = "trainer" if p.pid == me else "ray"
                if p.pid != me and top[p.pid] not in self.ray_roots:
                    kind = "local"
                t, cores = p.cpu_times(), ",".join(map(str, sorted(os.sched_getaffinity(p.pid))))
                title = os.path.basename((p.cmdline() or [p.name()])[0].split(" ")[0])
                cpu = t.user + t.system + t.children_user + t.children_system
                snap[p.pid] = (cpu, f"{kind}@{cores}", title)
            except (psutil.Error, OSError, IndexError):
                pass
        return snap

    def where(self) -> str:
        """Ray's actor and task processes (title ``ray::...``) and their cores."""
        seen: dict[str, list[str]] = {}
        for pid, (_, key, title) in self.snapshot().items():
            if title.startswith("ray::") and not title.endswith(AGENTS):
                name = "ray::" + title.split(":")[-1]  # the actors' names left out
                seen.setdefault(name, []).append(f"{pid} cores {key.split('@')[1]}")
        return "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(seen.items())) or "-"

    def pss_mib(self) -> tuple[float, float]:
        """PSS of the trainer, and summed over the tree, MiB."""
        sizes = [pss_kb(pid) for pid in self.snapshot()]  # the trainer first
        return sizes[0] / 1024, sum(sizes) / 1024


def delta(before: dict, after: dict, by: int = 1) -> dict[str, float]:
    """CPU seconds between two snapshots, by ``class@cores`` (``by=2``: by title)."""
    out: dict[str, float] = {}
    for pid, row in after.items():
        out[row[by]] = out.get(row[by], 0.0) + row[0] - before.get(pid, (0.0,))[0]
    return out


def core_busy() -> float:
    """Busy CPU seconds of cores 0 and 1 since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        rows = [[int(v) for v in line.split()[1:]] for line in f if line[:5] in ("cpu0 ", "cpu1 ")]
    return sum(sum(t) - t[3] - t[4] for t in rows) / TICK
