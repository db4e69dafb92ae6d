"""``worker_type="auto"``: threads or processes, chosen from what ``__getitem__`` does.

The first epoch starts at once on ``num_workers`` threads, each loading whole batches, and
measures every batch: the wall time and the thread's CPU time spent in ``__getitem__``,
over a window of at least :data:`WINDOW_S` and :data:`WINDOW_BATCHES` batches (or one
batch per thread, when there are fewer threads: slow batches then decide sooner). Two figures
decide (:func:`decide`):

- ``P``, the CPU seconds ``__getitem__`` used per second of the window, summed over the
  threads: the cores it kept busy. Code that holds the GIL cannot exceed one core however
  many threads run it; code that releases it (PIL, PyAV, large torch ops) can.
- ``f``, the share of a sample's wall time spent on the CPU: small when it waits (files,
  network, ``sleep``).

The rule, in order:

1. ``P`` above 0.65 of the cores the threads could use (``min(max(num_workers, 2),
   cores)``): the work runs in parallel on threads (it releases the GIL): threads. With
   one core, nothing runs in parallel anyway, and threads stay. (Measured here: JPEG
   decoding with PIL on 4 threads kept 1.49 of 2 cores busy, and ran at 499 images/s on
   threads against 433 in processes; code that holds the GIL stays near 1.0.)
2. ``P >= 0.5``: the GIL is the bottleneck (one core, shared by every thread): worker
   processes, as torch uses, unless moving a batch between processes would cost more
   than it saves: threads when a batch costs less CPU than :data:`MIN_PROCESS_BATCH_S`,
   or than copying its tensors twice (into the worker's arena, out of it) at
   :data:`COPY_BYTES_PER_S`. A batch of 128 3x224x224 images (19 MB) that takes 5 ms to
   stack stays on threads, where it is stacked once, into a recycled buffer.
   (Small NumPy ops release the GIL now and then: measured here, a 64x64 float32 chain
   kept 1.25 cores busy on two threads where processes ran it 1.4 times as fast.)
3. ``f < 0.5``: it mostly waits: threads, and more of them than ``num_workers``, since a
   waiting thread costs nothing: ``num_workers / max(f, 1/16)``, at most
   :data:`MAX_IO_THREADS`, each loading one sample at a time so that a batch is spread
   over many of them. Not with a ``worker_init_fn``: it sets up per-worker state
   (a connection, a file) and runs once per worker, so the workers stay ``num_workers``.
4. Otherwise (the loader, not ``__getitem__``, is the bottleneck): threads.

The loader switches plan at most once, early in the first epoch (the batches loaded
until then are kept; those not started yet are loaded by the new plan, so none is lost or
loaded twice), logs one line, keeps the choice in ``DataLoader.worker_choice`` and uses it
for every later epoch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

__all__ = [
    "usable_cores",
    "MAX_IO_THREADS",
    "COPY_BYTES_PER_S",
    "MIN_PROCESS_BATCH_S",
    "WINDOW_BATCHES",
    "WINDOW_S",
    "Measurement",
    "Probe",
    "SwitchGate",
    "WorkerChoice",
    "decide",
]

WINDOW_S = 0.1
WINDOW_BATCHES = 4
# Measured here (benchmarks/swap.py, 2 cores): a tokenizer batch of 1.7 ms of GIL-held CPU
# ran 1.7x as fast in worker processes as on threads; 256 path strings (0.3 ms a batch)
# ran 2x torch's rate on threads.
MIN_PROCESS_BATCH_S = 0.0005
COPY_BYTES_PER_S = 2e9  # one copy into memory that may not be faulted in yet (measured: 2-5)
MAX_IO_THREADS = 64
_PARALLEL = 0.65  # of the cores the threads could use
_GIL_BOUND = 0.5
_WAITS = 0.5


@dataclass(frozen=True)
class WorkerChoice:
    """How a loader runs ``__getitem__``: on ``threads`` threads, one sample (``per_batch``
    False) or one batch at a time each, or in ``num_workers`` processes."""

    kind: Literal["thread", "process"]
    threads: int
    _: KW_ONLY
    per_batch: bool
    reason: str

    def __str__(self) -> str:
        if self.kind == "process":
            return f"worker processes: {self.reason}"
        unit = "batch" if self.per_batch else "sample"
        return f"{self.threads} threads, a {unit} each: {self.reason}"


@dataclass(frozen=True)
class Measurement:
    """What the probe saw: ``samples`` loaded in ``batches`` batches over ``window_s``
    seconds, with ``busy_s`` wall and ``cpu_s`` thread CPU seconds inside
    ``__getitem__`` (summed over threads), and ``batch_bytes``, the tensor bytes of a
    batch (on average)."""

    samples: int
    batches: int
    window_s: float
    busy_s: float
    cpu_s: float
    batch_bytes: float = 0.0

    @property
    def cores(self) -> float:
        return self.cpu_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.busy_s if self.busy_s > 0 else 1.0


def decide(
    m: Measurement,
    num_workers: int,
    batch_size: int,
    *,
    cores: int | None = None,
    more_threads: bool = True,
) -> WorkerChoice:
    """The plan for a measurement (the rule in this module's docstring).

    Args:
        m: what the first batches' loading measured.
        num_workers: the loader's ``num_workers``.
        batch_size: samples per batch.
        cores: the cores this process may run on (default: its affinity mask).
        more_threads: whether waiting work may get more threads than ``num_workers``
            (not with a ``worker_init_fn``, which sets up one worker each).
    """
    if cores is None:
        cores = usable_cores()
    usable = min(max(num_workers, 2), cores)
    busy, share = m.cores, m.cpu_share
    per_sample = m.cpu_s / max(m.samples, 1)
    figures = f"__getitem__ kept {busy:.2f} cores busy, {share:.0%} of its time on the CPU"
    if busy > _PARALLEL * usable:
        return WorkerChoice(
            "thread", num_workers, per_batch=True, reason=f"it runs in parallel ({figures})"
        )
    if busy >= _GIL_BOUND:
        per_batch = per_sample * batch_size
        moving = max(MIN_PROCESS_BATCH_S, 2 * m.batch_bytes / COPY_BYTES_PER_S)
        if per_batch < moving:
            why = (
                f"it holds the GIL, but a batch costs {per_batch * 1e3:.2f} ms of CPU, "
                f"less than moving it from a process ({moving * 1e3:.2f} ms)"
            )
            return WorkerChoice("thread", num_workers, per_batch=True, reason=f"{why} ({figures})")
        return WorkerChoice(
            "process", num_workers, per_batch=True, reason=f"it holds the GIL ({figures})"
        )
    if share < _WAITS:
        threads = num_workers
        if more_threads:
            wanted = math.ceil(num_workers / max(share, 1 / 16))
            threads = min(MAX_IO_THREADS, max(num_workers, wanted))
        return WorkerChoice("thread", threads, per_batch=False, reason=f"it waits ({figures})")
    return WorkerChoice(
        "thread", num_workers, per_batch=True, reason=f"the loader is the bottleneck ({figures})"
    )


class Probe:
    """Measures whole-batch loads on threads until the window is full."""

    def __init__(self, min_batches: int = WINDOW_BATCHES) -> None:
        self.min_batches = min_batches
        self._lock = threading.Lock()
        self._start: float | None = None
        self._end = 0.0
        self._samples = 0
        self._batches = 0
        self._busy = 0.0
        self._cpu = 0.0
        self._bytes = 0
        self.done = False

    def started(self, now: float) -> None:
        if self._start is None:
            with self._lock:
                if self._start is None:
                    self._start = now

    def record(self, samples: int, wall: float, cpu: float, now: float, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            self._samples += samples
            self._batches += 1
            self._busy += wall
            self._cpu += cpu
            self._end = now

    def measurement(self) -> Measurement | None:
        """The window's figures once it is full, else None."""
        with self._lock:
            if self._start is None:
                return None
            window = self._end - self._start
            if self._batches < self.min_batches or window < WINDOW_S:
                return None
            return self._figures(window)

    def _figures(self, window: float) -> Measurement:
        per_batch = self._bytes / max(self._batches, 1)
        return Measurement(self._samples, self._batches, window, self._busy, self._cpu, per_batch)

    def final(self) -> Measurement | None:
        """Whatever was measured (at the end of a short epoch), if anything."""
        with self._lock:
            if self._start is None or not self._batches:
                return None
            return self._figures(max(self._end - self._start, 1e-9))


class SwitchGate:
    """Hands the batches not yet started over to a new plan, exactly once.

    Batches start in order on the probing pipeline; when the plan changes, every batch
    numbered from ``cut`` (one past the highest started) is set aside instead of loaded,
    and the source stops. The next pipeline loads the set-aside batches, then the rest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._highest = -1
        self.cut: int | None = None
        self.choice: WorkerChoice | None = None
        self.deferred: list[tuple[int, Any]] = []
        self.next_batch: int | None = None  # where the source stopped, if it did

    def start(self, b: int, item: tuple[int, Any]) -> bool:
        """Whether batch ``b`` is loaded here (else it was set aside for the next plan)."""
        with self._lock:
            if self.cut is not None and b >= self.cut:
                self.deferred.append(item)
                return False
            self._highest = max(self._highest, b)
            return True

    def switch(self, choice: WorkerChoice) -> None:
        with self._lock:
            if self.cut is None:
                self.cut = self._highest + 1
                self.choice = choice

    @property
    def switched(self) -> bool:
        return self.cut is not None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def clock() -> tuple[float, float]:
    """Wall and this thread's CPU time."""
    return time.perf_counter(), time.thread_time()
