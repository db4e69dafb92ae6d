"""Run one benchmark case in a fresh process and measure it from outside and inside.

Every timed run is a new process forked from a *forkserver* that has already imported torch
and torch_spdl: each run starts clean (no allocator state, threads or page cache of earlier
runs in its own memory) without paying the 1-2 s import every time. A memory run is a
fresh interpreter (why: below), except in quick modes.

Measured for each run:

- ``samples`` and ``seconds``: one timed section (loader made, every batch read); the
  throughput is their ratio.
- ``first_batch_s``: loader made, ``iter()``, first ``next()`` (when the case can tell).
- ``cpu_s``: CPU time (user + system) of the process and all its children during the timed
  section: ``getrusage`` of the process and of its reaped children, plus children still
  alive at the end (``psutil``). CPU utilisation is ``cpu_s / (seconds * cores)``.
- ``peak_mib``: peak of the memory of the run's process and all its descendants, sampled
  every 50 ms from the parent over the run's whole life: the summed PSS
  (``/proc/<pid>/smaps_rollup``; RSS where that is missing), plus the shared-memory files
  (memfd, ``/dev/shm``) that a process of the tree holds open but none maps. Only in the
  *memory runs* (below); a timed run has none. ``peak_where`` says what that peak was
  made of: the run's process and its descendants apart, each as anonymous, shared-memory
  and file-backed PSS (``where_text``).

Why memory is measured in runs of its own: reading ``smaps_rollup`` walks the page tables
of a process, about 3 ms of CPU for one with torch imported, so sampling a training
process and its two workers every 50 ms took about a fifth of a core from the run it
measured. On 2 cores that decided the result: path strings with a training consumer ran
at 15.0k samples/s (torch) and 13.7k (ours) sampled every 50 ms, and at 28.9k and 27.5k
sampled every second, and a training step whose intra-op threads lose a core mid-region
stalls far longer than the time taken from it. So :func:`measure_all` first runs every
configuration once more with the sampler (its peak memory, nothing else, is kept), then
the timed runs without it.

Why a memory run starts a fresh interpreter (``spawn``) instead of a forkserver child:
a forkserver child shares the forkserver's pages (torch's imported code and objects), and
PSS counts a shared page at half. The first full garbage collection in the run writes to
the header of every object it inherited and so copies those pages: the run's memory then
grows by tens of MiB that a script started as people start one (its torch pages private
from the start) never shows. Measured on the 10 ms I/O cell, 2 workers, ``train``
consumer: the staged loader's run set off one full collection (generations 0/1/2: 11/1/1
collections, the plain loader's 2/0/0), its main process's private dirty memory went from
25 to 103 MiB, and the table showed it 22% above torch; in fresh interpreters the two
loaders peaked within 4 MiB of each other. Timed runs stay forkserver children (no 1-2 s
import per run), but that first full collection costs them time too: measured on the same
cell, it came inside ``iter()`` on both sides (each child inherits the forkserver's
collection counters, so each reaches it at the same point), took 182-189 ms with 21.6k
page faults, and made torch's and our loader's first batch 380-420 ms where it is about
200 ms in a script started from a shell; on a 2.4 s run that is 8% added to both sides.
So a run collects once (``gc.collect()``) before its case builds anything: the pages are
copied then, before the clock, and the timed section starts from a collected heap that is
the run's own, as a script's is after its imports.

Why the second term: PSS counts only pages mapped into some process. torch's workers put
each batch in a shared-memory file and pass its descriptor; until the training loop takes
the batch, the file is held open by the worker (for the receiver to fetch) and mapped by
no one. Measured on the 3x224x224 batch-128 cell with 4 workers and a training consumer,
the batches queued that way were 165 MiB that summed PSS did not see, and torch's peak
looked 170 MiB lower than ours where the two are equal. Our workers' batches sit in
mapped arenas, which PSS already counts; counting unmapped shared files as well measures
both loaders by the same rule.

Why a run can be refused and run again: the machine is shared, and 2 cores leave no room
for a third party. ``foreign_cpu_s`` is the CPU the whole machine used during the timed
section (``/proc/stat``) less the run's own: another job's. One import of torch elsewhere
(3 s of a core) made a 5-epoch training script 2 s slower and a single epoch of it 6 s
long where it takes 0.8, while runs beside it took 0.0-0.2 s of foreign CPU. A timed run
whose foreign CPU exceeds :data:`FOREIGN_LIMIT` of its core-seconds (and 0.1 s: a
sub-second run meets 5% with the kernel's own housekeeping) is dropped and run
again (at most :data:`RETRIES` times; the last try is kept, with its figure), and
:func:`measure_all` reports how many runs it dropped.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import multiprocessing as mp
import os
import platform
import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psutil


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


FOREIGN_LIMIT = 0.05  # of a timed section's core-seconds, taken by other processes
FOREIGN_FLOOR_S = 0.1  # CPU-s of others below which no run counts as disturbed
RETRIES = 4  # tries after the first for a run that other processes disturbed


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: all but
    idle and iowait); 0.0 where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


PRELOAD = ["torch", "torchvision", "av", "torch_spdl", "torch_spdl.data", "torch_spdl.io"]


@dataclass(frozen=True)
class Spec:
    """One configuration to measure: ``_cases.<fn>(**kwargs)`` for one implementation."""

    group: str  # the table it belongs to
    impl: str  # "torch" or "torch_spdl"
    param: int  # the swept value (concurrency, batch size) or 0
    fn: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # the case, for tables without a swept value


@dataclass
class Sample:
    """One measured run."""

    samples: int
    seconds: float
    cpu_s: float
    peak_mib: float | None = None  # a memory run's only (see the module's notes)
    peak_where: str = ""  # a memory run's: what its peak was made of (``where_text``)
    first_batch_s: float | None = None
    foreign_cpu_s: float = 0.0  # other processes' CPU during the timed section

    def disturbed(self, cores: int) -> bool:
        """Other processes took more than :data:`FOREIGN_LIMIT` of the section's cores (and
        more than :data:`FOREIGN_FLOOR_S`: the machine's own housekeeping is not a job)."""
        return self.foreign_cpu_s > max(FOREIGN_FLOOR_S, FOREIGN_LIMIT * self.seconds * cores)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    def cpu_pct(self, cores: int) -> float:
        """Share of the machine's cores busy during the timed section, in percent."""
        return 100.0 * self.cpu_s / (self.seconds * cores) if self.seconds > 0 else float("nan")


@dataclass
class Result:
    spec: Spec
    runs: list[Sample] = field(default_factory=list)  # timed, without the memory sampler
    memory_runs: list[Sample] = field(default_factory=list)  # sampled, not timed
    error: str | None = None
    dropped: int = 0  # timed runs dropped and run again: other processes disturbed them

    def peaks(self) -> list[float]:
        """Peak memory of every run that sampled it, MiB."""
        return [s.peak_mib for s in (*self.memory_runs, *self.runs) if s.peak_mib is not None]


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


def _child_main(fn_name: str, kwargs: dict[str, Any], conn: Connection, origin: str) -> None:
    """In the run's process: call the case inside a CPU meter and send its figures back."""
    # The run inherits the forkserver's start method; a script run by hand on Linux (Python
    # 3.11-3.13) forks, so torch's worker processes fork here too, as children of this run.
    mp.set_start_method("fork", force=True)
    try:
        if _origin() != origin:  # measure the torch_spdl the report names, or nothing
            raise RuntimeError(f"this run imported {_origin()}, the parent {origin}")
        fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module("_cases"), fn_name)
        gc.collect()  # copy the pages shared with the forkserver now (the module's notes)
        out = fn(**kwargs)  # measures its own CPU over its timed section
        if CpuMeter.last is not None:
            out.setdefault("foreign_cpu_s", CpuMeter.last.foreign_s)
        conn.send(("ok", out))
    except BaseException as exc:  # the parent reports it against the run's spec
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class Runner:
    """Starts runs in fresh processes from a forkserver with torch already imported."""

    def __init__(
        self, timeout: float = 600.0, sample_s: float = 0.05, fresh_memory: bool = True
    ) -> None:
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload([*PRELOAD, "dataloader", "_cases"])
        # memory runs in fresh interpreters (see the module's notes), or, quick, forked
        self.fresh = mp.get_context("spawn") if fresh_memory else self.ctx
        self.timeout = timeout
        self.sample_s = sample_s  # PSS sampling interval (reading smaps_rollup costs CPU)

    def _start_server(self) -> None:
        """Start the forkserver from this folder: it runs ``python -c`` with the working
        directory first on ``sys.path`` (and ignores ours), so started from a checkout's root
        it would preload *that* checkout's torch_spdl, not the one this process imports."""
        from multiprocessing import forkserver

        cwd = os.getcwd()
        os.chdir(os.path.dirname(os.path.abspath(__file__)))
        try:
            forkserver.ensure_running()
        finally:
            os.chdir(cwd)

    def run(self, spec: Spec, memory: bool = True) -> Sample:
        """One run of ``spec`` in a fresh process; ``memory``: sample its peak memory (which
        costs the run CPU: see the module's notes), else leave ``peak_mib`` None."""
        ctx = self.fresh if memory else self.ctx
        if ctx is self.ctx:
            self._start_server()  # a no-op once it runs
        reader, writer = ctx.Pipe(duplex=False)
        args = (spec.fn, dict(spec.kwargs), writer, _origin())
        proc = ctx.Process(target=_child_main, args=args)
        proc.start()
        writer.close()
        try:
            sampler = PeakMemory(proc.pid, self.sample_s) if memory else None
            with sampler or contextlib.nullcontext():
                if not reader.poll(self.timeout):
                    raise TimeoutError(f"{spec} gave no result within {self.timeout:.0f} s")
                status, out = reader.recv()
                proc.join(self.timeout)
        finally:
            reader.close()
            if proc.is_alive():  # timed out or stuck: take its worker processes down too
                try:
                    stragglers = psutil.Process(proc.pid).children(recursive=True)
                except psutil.Error:
                    stragglers = []
                proc.kill()
                proc.join()
                for child in stragglers:
                    with contextlib.suppress(psutil.Error):
                        child.kill()
        if status != "ok":
            raise RuntimeError(f"{spec.fn} {dict(spec.kwargs)} ({spec.impl}) failed: {out}")
        return Sample(
            samples=int(out["samples"]),
            seconds=float(out["seconds"]),
            cpu_s=float(out["cpu_s"]),
            peak_mib=sampler.peak_kb / 1024 if sampler is not None else None,
            peak_where=sampler.where if sampler is not None else "",
            first_batch_s=out.get("first_batch_s"),
            foreign_cpu_s=float(out.get("foreign_cpu_s", 0.0)),
        )


def _origin() -> str:
    """Where this process's torch_spdl comes from."""
    import torch_spdl

    return os.path.dirname(os.path.abspath(torch_spdl.__file__ or ""))


def interleave(specs: list[Spec], repeats: int) -> list[Spec]:
    """The order of the runs: every configuration once, then again, ``repeats`` times, in
    reverse on odd rounds (so a pair's two sides take turns going first, and a burst of load
    from elsewhere on the machine spreads over every configuration)."""
    return [s for r in range(repeats) for s in (specs if r % 2 == 0 else specs[::-1])]


def measure_all(
    specs: list[Spec],
    repeats: int,
    desc: str = "benchmark runs",
    sample_s: float = 0.05,
    memory_runs: int = 1,
    fresh_memory: bool = True,
    retries: int = RETRIES,
) -> list[Result]:
    """Every spec ``memory_runs`` times with the memory sampler, then ``repeats`` times
    timed without it, all in ``interleave`` order, each in a fresh process, with a progress
    bar; a spec that fails once is not run again and keeps its error. A timed run that
    other processes disturbed is run again, up to ``retries`` times (see the module's
    notes; 0 where nobody reads the figures, as in CI beside the tests). ``fresh_memory``
    False (quick modes): memory runs are forkserver children too, 2 s sooner each."""
    from tqdm import tqdm

    results = {s: Result(s) for s in specs}
    runner = Runner(sample_s=sample_s, fresh_memory=fresh_memory)
    cores = cpu_count()
    order = [(s, True) for s in interleave(specs, memory_runs)]
    order += [(s, False) for s in interleave(specs, repeats)]
    for spec, memory in tqdm(order, desc=desc, unit="run", dynamic_ncols=True):
        result = results[spec]
        if result.error:
            continue
        try:
            sample = runner.run(spec, memory)
            for _ in range(0 if memory else retries):
                if not sample.disturbed(cores):
                    break
                result.dropped += 1
                tqdm.write(f"run again, {sample.foreign_cpu_s:.2f} CPU-s of others: {spec}")
                sample = runner.run(spec, memory)
            (result.memory_runs if memory else result.runs).append(sample)
        except Exception as exc:  # keep going: the report names what failed
            result.error = str(exc)
            tqdm.write(f"FAILED: {exc}")
    return list(results.values())


def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # not installed, or no version: say so in the report
        return "not installed"


def _commit(module: str) -> str:
    """The git commit of a module's checkout, ``-dirty`` with uncommitted changes."""
    import subprocess

    try:
        where = os.path.dirname(importlib.import_module(module).__file__ or ".")
        out = subprocess.run(
            ["git", "-C", where, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "no git checkout"
    except Exception:  # no git, no checkout: say so in the report
        return "commit unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, str]:
    """What the figures were measured on, for the report's header."""
    mem = psutil.virtual_memory().total / 2**30
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cores": str(os.cpu_count()),
        "usable cores": str(cpu_count()),
        "CPU": _cpu_model(),
        "memory": f"{mem:.1f} GiB",
        "OS": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python": platform.python_version(),
        "torch": _version("torch"),
        "torchvision": _version("torchvision"),
        "av (PyAV)": _version("av"),
        "torch_spdl": f"{_version('torch_spdl')} ({_commit('torch_spdl')})",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
