"""Run one benchmark case in a fresh process and bring its figures back.

Every timed run is a new process forked from a *forkserver* that has already imported torch
and torch_spdl: each run starts clean (no allocator state, threads or page cache of earlier
runs in its own memory) without paying the 1-2 s import every time. A memory run is a
fresh interpreter (why: below), except in quick modes; its peak memory is sampled from
here (``_memory.py``), its CPU inside the run (``_cpu_meter.py``).

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
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import psutil
from _cpu_meter import CpuMeter
from _memory import PeakMemory
from _results import Sample, Spec

PRELOAD = ["torch", "torchvision", "av", "torch_spdl", "torch_spdl.data", "torch_spdl.io"]


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
