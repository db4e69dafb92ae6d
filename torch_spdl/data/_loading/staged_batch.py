"""A staged dataset's batch inside one worker: its ``io`` stages on the worker's own
threads, every sample at once, then its ``cpu`` stages one sample after another.

Why in the worker, and not on threads of the training process: a worker process (or a
Ray actor) is where torch runs ``__getitem__``, so running the stages there keeps the
training process free of user code (its cores, its GIL, its memory are the training
step's), the loaded data never crosses a process boundary, and a read that waits (a
network file system, an object store) waits beside the other reads of its batch instead
of one after another. Where reads are cheap the split then costs the plain
``__getitem__`` only a hand-off to a thread per sample. The ``cpu`` stages run on the
worker's main thread in the batch's order, so a random augmentation draws what it draws
under torch; an ``io`` stage draws nothing at random (the contract of ``load``, which
``torch-spdl migrate`` checks before it splits).

A sync ``io`` stage that does not wait is run inline: after the worker's first batch
(which starts the threads and pays every first use: 30 ms against the next one's 5 in a
detection script's worker), :data:`MEASURED` batches run on the threads and time each
sample's ``io`` stages (wall and the thread's CPU time)
and each batch's wall time (:func:`verdict`). When a sample's CPU was at least
:data:`COMPUTES` of its wall time, the reads did not wait (a file in the page cache, a
decode inside ``load``), threads cannot overlap anything, and from then on the worker runs
them one after another on its main thread, which costs what ``__getitem__`` costs. A
sample's wall time on threads also holds its wait for the GIL and for a core behind the
batch's other samples: eight threads decoding small JPEGs under the GIL took 0.3 s of
CPU a second of each sample's wall, and 1.2 s a second of the batch's (one-off,
2026-12-04), so where the samples' CPU is at least :data:`COMPUTES` of the *batches'*
wall time, the threads may only have taken turns, and the next batch runs inline, timed,
as a trial: inline from then on if it took no longer a sample than the threaded batches
(:func:`inline_wins`), on threads otherwise (a read that waits 5 ms before a 5 ms decode
under the GIL: the trial takes about three times as long). Reads that clearly waited
never pay for a trial. The order of the ``cpu`` stages, and so every result, is the same
either way.

A worker that runs its loads inline keeps checking that they do not wait: each inline
batch reads its main thread's CPU clock and ``/proc/thread-self/schedstat`` (time runnable
in a queue) before and after, and :data:`MEASURED` batches in a row whose loads slept for
more than ``1 - COMPUTES`` of their wall time (reads that went to a disk or a network
again) send the worker back to its threads, measured afresh (one such batch is not
enough: a detection script's inline batches of local JPEGs now and then sleep a third of
their 5 ms).

What a worker decided outlives it: the loader keeps each worker id's last decision, and
the next epoch's worker of that id starts from it: inline from its first batch, or, where
the loads stayed on the threads (a trial lost, a verdict of waits, loads that slept), on
its threads, measured as ever but never trying inline again (a trial costs a batch of
serial reads). Without that a loader without ``persistent_workers`` measured again every
epoch: in a detection script's workers (batches of 8 JPEGs decoded inside ``load``), the
first batch on the threads took 37 ms against 4.6 ms inline, and 250 of 374 batches of 6
epochs ran on threads at 6.6 ms (2026-12-04). The threaded measure stays each sample's
CPU clock: adding its time runnable in a queue (read on the load threads) judged decodes
on contended cores better, but made the worker's freed-pages test fail 1 run in 8.

A layout other than "``io`` stages first, then ``cpu`` stages" runs as ``__getitem__``
(:func:`staged_steps` returns None). An ``async`` ``io`` stage runs on one event loop of
the worker's, kept for its life (a client session bound to the loop stays usable from
batch to batch); a sync one on a pool of ``threads`` threads. A sample whose ``io``
stage fails becomes a :class:`StageFailed`, which ``fetch_batch`` reports as that
sample's error, named by its stage, as it reports a failing ``__getitem__``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = [
    "StageFailed",
    "StagedBatch",
    "computes",
    "inline_wins",
    "slept",
    "staged_steps",
    "verdict",
]

_WHO = "torch_spdl.DataLoader"
WARMUP = 1  # a worker's first batches on the threads, not timed (they start the threads)
MEASURED = 2  # batches timed on the threads, after those, before a worker decides
COMPUTES = 0.7  # the io stages' CPU over their wall time from which they run inline

Step = tuple[str, Callable[[Any], Any]]  # (name, fn)


class StageFailed:
    """A sample whose ``io`` stage raised: the exception, noted with the stage's name."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def staged_steps(dataset: Any) -> tuple[list[Step], list[Step]] | None:
    """A staged dataset's ``(io, cpu)`` stages as ``(name, fn)``, or None: not a staged
    dataset, no ``io`` stage, or one after a ``cpu`` stage (run as ``__getitem__``)."""
    from .staged_dataset import StagedDataset

    if not isinstance(dataset, StagedDataset):
        return None
    stages = list(dataset.stages())
    kinds = [s.kind for s in stages]
    if "io" not in kinds or kinds != sorted(kinds, key=lambda k: k != "io"):
        return None
    named = [(s.kind, str(s.name or getattr(s.fn, "__name__", "stage")), s.fn) for s in stages]
    io = [(name, fn) for kind, name, fn in named if kind == "io"]
    cpu = [(name, _sync(fn, name)) for kind, name, fn in named if kind == "cpu"]
    return io, cpu


class StagedBatch:
    """The ``io`` stages of a staged dataset's batches, in one worker (module notes).

    Args:
        io: the ``io`` stages, as :func:`staged_steps` gives them.
        cpu: the ``cpu`` stages, run by ``fetch_batch`` after :meth:`load`.
        threads: samples whose ``io`` stages run at once.
        learned: what this worker id decided last epoch: True, start with the loads
            inline; False, they stayed on the threads (no trial again); None, nothing yet.
    """

    def __init__(
        self, io: list[Step], cpu: list[Step], threads: int, learned: bool | None = None
    ) -> None:
        self.cpu_steps = [fn for _, fn in cpu]
        self._io = io
        self._threads = max(1, threads)
        self._async = any(inspect.iscoroutinefunction(fn) for _, fn in io)
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timed: list[tuple[float, float]] = []  # (wall, CPU) of each sample's io stages
        self._walls: list[tuple[float, int]] = []  # (wall, samples) of each measured batch
        self._batches = 0
        self._trial = False  # the next batch runs inline, timed (module notes)
        self.inline = learned is True  # decided after MEASURED batches: they do not wait
        self._trials = learned is not False  # a trial lost last epoch is not run again
        self.on_threads = False  # the last batch's io stages ran on the pool's threads
        self._decided: bool | None = learned  # the last decision (None: none yet)
        self._told: bool | None = learned  # the decision last given by :meth:`news`
        self._slept = 0  # inline batches in a row whose loads slept

    @classmethod
    def of(cls, dataset: Any, threads: int, learned: bool | None = None) -> StagedBatch | None:
        """The staged batches of ``dataset``, or None (run it as ``__getitem__``)."""
        steps = staged_steps(dataset)
        return None if steps is None else cls(*steps, threads, learned)

    def news(self) -> bool | None:
        """The last decision (True: the loads run inline; False: on the threads after a
        trial or a verdict), when it changed since the last call (else None): what the
        loader keeps for the next epoch's worker of this id."""
        if self._async or self._decided is None or self._decided == self._told:
            return None
        self._told = self._decided
        return self._decided

    def load(self, values: list[Any], indices: list[Any]) -> list[Any]:
        """Every sample's ``io`` stages, at once: each one's output, or a :class:`StageFailed`."""
        if self._async:
            self.on_threads = True  # its loop's thread, and its pool's for sync stages
            future = asyncio.run_coroutine_threadsafe(self._gather(values, indices), self._loop_())
            return future.result()
        self.on_threads = not (self.inline or self._trial)
        if not self.on_threads:
            began, clocks = time.perf_counter(), _thread_clocks()
            out = [self._one(v, i) for v, i in zip(values, indices, strict=True)]
            wall = time.perf_counter() - began
            if self._trial:
                self._trial = False
                self.inline = self._decided = inline_wins(self._walls, (wall, len(values)))
                self._walls.clear()
            elif not slept(clocks, _thread_clocks(), wall):
                self._slept = 0
            else:
                self._slept += 1
                if self._slept >= MEASURED:  # the loads wait again: back to the threads
                    self.inline = self._decided = False
                    self._slept = 0
                    self._batches = min(self._batches, WARMUP)
            return out
        self._batches += 1
        if self._batches <= WARMUP:
            return list(self._pool_().map(self._one, values, indices))
        began = time.perf_counter()
        out = list(self._pool_().map(self._one_timed, values, indices))
        if self._batches <= WARMUP + MEASURED:
            self._walls.append((time.perf_counter() - began, len(values)))
        if self._batches == WARMUP + MEASURED:
            decided = verdict(self._timed, self._walls)
            self.inline = decided == "inline"
            self._trial = decided == "try" and self._trials
            if not self._trial:
                self._decided = self.inline
            self._timed.clear()
            if not self._trial:
                self._walls.clear()
        return out

    # -- one sample -------------------------------------------------------------------------
    def _one(self, value: Any, index: Any) -> Any:
        name = ""
        try:
            for name, fn in self._io:  # noqa: B007 (the failing one's name, below)
                value = fn(value)
                if inspect.isawaitable(value):  # a sync function that returned a coroutine
                    value = asyncio.run(_awaited(value))
            return value
        except Exception as exc:
            return _failed(exc, name, index)

    def _one_timed(self, value: Any, index: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        out = self._one(value, index)
        self._timed.append((time.perf_counter() - wall, time.thread_time() - cpu))  # atomic
        return out

    async def _one_async(self, value: Any, index: Any, room: asyncio.Semaphore) -> Any:
        name = ""
        async with room:
            try:
                for name, fn in self._io:  # noqa: B007 (the failing one's name, below)
                    if inspect.iscoroutinefunction(fn):
                        value = await fn(value)
                    else:
                        value = await asyncio.get_running_loop().run_in_executor(
                            self._pool_(), fn, value
                        )
                return value
            except Exception as exc:
                return _failed(exc, name, index)

    async def _gather(self, values: list[Any], indices: list[Any]) -> list[Any]:
        room = asyncio.Semaphore(self._threads)
        return list(
            await asyncio.gather(
                *(self._one_async(v, i, room) for v, i in zip(values, indices, strict=True))
            )
        )

    def _pool_(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="torch_spdl-io")
        return self._pool

    def _loop_(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._loop.run_forever, name="torch_spdl-io-loop", daemon=True
            ).start()
        return self._loop


def computes(timed: list[tuple[float, float]]) -> bool:
    """Whether ``io`` stages timed as ``(wall, CPU)`` seconds a sample did not wait: their
    CPU was at least :data:`COMPUTES` of their wall time (none timed: they wait)."""
    wall = sum(w for w, _ in timed)
    return wall > 0 and sum(c for _, c in timed) >= COMPUTES * wall


def verdict(timed: list[tuple[float, float]], batches: list[tuple[float, int]]) -> str:
    """What the timed threaded batches say (module notes): ``"inline"`` where each sample
    computed (:func:`computes`), ``"try"`` where the samples' CPU is at least
    :data:`COMPUTES` of the batches' wall time (the threads may only have taken turns),
    else ``"threads"``. ``timed``: ``(wall, CPU)`` a sample; ``batches``: ``(wall,
    samples)`` a batch."""
    if computes(timed):
        return "inline"
    wall = sum(w for w, _ in batches)
    return "try" if wall > 0 and sum(c for _, c in timed) >= COMPUTES * wall else "threads"


def _thread_clocks() -> tuple[float, float | None]:
    """This thread's CPU time and its time runnable in a queue (None without ``/proc``),
    seconds. The CPU time is the clock's, which is exact; ``schedstat``'s own counts a
    running thread's time only up to its last tick or switch (up to 4 ms behind)."""
    cpu = time.thread_time()
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        try:
            fields = os.read(fd, 96).split()
        finally:
            os.close(fd)
        return cpu, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return cpu, None


def slept(
    before: tuple[float, float | None], after: tuple[float, float | None], wall: float
) -> bool:
    """Whether a thread whose clocks (:func:`_thread_clocks`) went from ``before`` to
    ``after`` in ``wall`` seconds slept (neither ran nor waited for a core) more than ``1 -
    COMPUTES`` of that time (no queue clock: False, the loads stay where they are)."""
    if before[1] is None or after[1] is None or wall <= 0:
        return False
    busy = after[0] - before[0] + after[1] - before[1]
    return wall - busy > (1 - COMPUTES) * wall


def inline_wins(threaded: list[tuple[float, int]], trial: tuple[float, int]) -> bool:
    """Whether a batch run inline, ``trial`` as ``(wall, samples)``, took no longer a sample
    than the ``threaded`` batches, each ``(wall, samples)``, did."""
    wall, samples = sum(w for w, _ in threaded), sum(n for _, n in threaded)
    return samples > 0 and trial[1] > 0 and trial[0] / trial[1] <= wall / samples


def _failed(exc: Exception, name: str, index: Any) -> StageFailed:
    exc.add_note(f"{_WHO}: stage {name!r} failed on sample index {index!r}")
    return StageFailed(exc)


def _sync(fn: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    """A ``cpu`` stage as a plain function named as the stage (an ``async`` one run to its
    end here): ``fetch_batch`` names a failing stage by its function's name."""
    if not inspect.iscoroutinefunction(fn) and getattr(fn, "__name__", None) == name:
        return fn

    def step(value: Any) -> Any:
        out = fn(value)
        return asyncio.run(_awaited(out)) if inspect.isawaitable(out) else out

    step.__name__ = name
    return step


async def _awaited(value: Any) -> Any:
    return await value
