"""Peak memory of a run's process tree: summed PSS plus shared files that no process maps.

``peak_mib`` is the peak of the memory of the run's process and all its descendants,
sampled every 50 ms from the parent over the run's whole life: the summed PSS
(``/proc/<pid>/smaps_rollup``; RSS where that is missing), plus the shared-memory files
(memfd, ``/dev/shm``) that a process of the tree holds open but none maps. ``peak_where``
says what that peak was made of: the run's process and its descendants apart, each as
anonymous, shared-memory and file-backed PSS (:func:`where_text`).

Why memory is measured in runs of its own (``_measure.measure_all``): reading
``smaps_rollup`` walks the page tables of a process, about 3 ms of CPU for one with torch
imported, so sampling a training process and its two workers every 50 ms took about a fifth
of a core from the run it measured. On 2 cores that decided the result: path strings with a
training consumer ran at 15.0k samples/s (torch) and 13.7k (ours) sampled every 50 ms, and
at 28.9k and 27.5k sampled every second, and a training step whose intra-op threads lose a
core mid-region stalls far longer than the time taken from it. So every configuration runs
once more with the sampler (its peak memory, nothing else, is kept), and the timed runs go
without it.

Why the second term: PSS counts only pages mapped into some process. torch's workers put
each batch in a shared-memory file and pass its descriptor; until the training loop takes
the batch, the file is held open by the worker (for the receiver to fetch) and mapped by
no one. Measured on the 3x224x224 batch-128 cell with 4 workers and a training consumer,
the batches queued that way were 165 MiB that summed PSS did not see, and torch's peak
looked 170 MiB lower than ours where the two are equal. Our workers' batches sit in
mapped arenas, which PSS already counts; counting unmapped shared files as well measures
both loaders by the same rule.
"""

from __future__ import annotations

import os
import threading

import psutil

_ROLLUP = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def pss_parts_kb(pid: int) -> dict[str, int]:
    """PSS of one process in kB, in all and by kind (``Pss``, ``Pss_Anon``, ``Pss_File``,
    ``Pss_Shmem``; only ``Pss``, its RSS, where ``smaps_rollup`` is missing); empty once
    the process is gone."""
    parts: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in _ROLLUP:
                    parts[key] = int(value.split()[0])
        if "Pss" in parts:
            return parts
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return {"Pss": int(line.split()[1])}
    except (FileNotFoundError, ProcessLookupError):
        pass
    return {}


def pss_kb(pid: int) -> int:
    """PSS of one process in kB (RSS where ``smaps_rollup`` is missing); 0 once it is gone."""
    return pss_parts_kb(pid).get("Pss", 0)


def _shm_held_unmapped_kb(pids: list[int]) -> int:
    """Allocated size in kB of the shared-memory files (memfd, ``/dev/shm``) that some
    process of ``pids`` holds open and none of them maps (so no PSS counts them)."""
    held: dict[tuple[int, int], int] = {}  # (device, inode) -> allocated bytes
    mapped: set[tuple[int, int]] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(path)
                if target.startswith(("/memfd:", "/dev/shm/")):
                    st = os.stat(path)
                    held[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:
                continue
    if not held:
        return 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(maxsplit=5)
                    if len(parts) >= 5 and parts[4] != "0":
                        major, minor = parts[3].split(":")
                        mapped.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
        except OSError:
            continue
    return sum(size for key, size in held.items() if key not in mapped) // 1024


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (those that exist now)."""
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


class PeakMemory:
    """Background thread: every 50 ms, the memory of ``pid`` and its descendants (summed
    PSS, plus shared-memory files held open and mapped by none: see the module's notes).
    ``where`` says where the peak was: :func:`where_text` of the sample that set it."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kb = 0
        self.where = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = _tree(self.pid)
            parts = [pss_parts_kb(p) for p in pids]
            unmapped = _shm_held_unmapped_kb(pids)
            total = sum(p.get("Pss", 0) for p in parts) + unmapped
            if total > self.peak_kb:
                self.peak_kb = total
                self.where = where_text(parts, unmapped)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def where_text(parts: list[dict[str, int]], unmapped_kb: int) -> str:
    """One sample's memory by process and kind, MiB: the run's own process, then its
    descendants together (a loader's workers), then the unmapped shared files; e.g.
    ``main 317 (anon 63, file 252, shmem 1); 4 children 317 (anon 254, file 36, shmem 25);
    unmapped shm 0``. What a peak is made of says which side of a fork grew."""

    def one(label: str, group: list[dict[str, int]]) -> str:
        def mib(key: str) -> int:
            return round(sum(p.get(key, 0) for p in group) / 1024)

        kinds = ", ".join(f"{k[4:].lower()} {mib(k)}" for k in _ROLLUP[1:])
        return f"{label} {mib('Pss')} ({kinds})"

    text = [one("main", parts[:1])] if parts else []
    if len(parts) > 1:
        text.append(one(f"{len(parts) - 1} children", parts[1:]))
    return "; ".join([*text, f"unmapped shm {round(unmapped_kb / 1024)}"])
