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

A sync ``io`` stage runs inline, on the worker's main thread, one sample after another,
until it is seen to wait: each inline batch reads that thread's CPU clock, its voluntary
context switches (``RUSAGE_THREAD``) and ``/proc/thread-self/schedstat`` (time runnable in
a queue) before and after, and :data:`MEASURED` batches in a row whose loads blocked and
slept (neither ran nor waited for a core) more than ``1 - COMPUTES`` of their wall time
(reads that went to a disk or a network) move the worker's loads to its threads, every
sample of a batch at once (one such batch is not enough: a detection script's inline
batches of local JPEGs now and then sleep a third of their 5 ms). Why inline first, and
not threads first and a verdict from them: on the main thread a load blocks only where it
waits for something outside the process (a loaded machine only queues it), and on threads
the clocks cannot tell, since a thread waiting for the GIL blocks and sleeps as a read
does. Started on their threads and judged there, the two workers of a detection script
(batches of 8 local JPEGs decoded inside ``load``, beside the training step on 2 cores)
judged half their epochs "waits" and ran them on the threads, at 25-35% more CPU than the
plain ``__getitem__`` (2026-12-04). The cost: a worker whose reads do wait runs its first
:data:`MEASURED` batches' loads one after another (once for each worker id of a loader:
the decision outlives the worker, below). A loader given an ``io_concurrency`` (a number)
was told the reads wait: its workers start their loads on the threads, timed as below
(``threads_first``).

On its threads a worker keeps timing: after the first threaded batch (which starts the
threads and pays every first use), :data:`MEASURED` batches time each sample's ``io``
stages (wall and the thread's CPU time) and each batch's wall time (:func:`verdict`).
When a sample's CPU was at least :data:`COMPUTES` of its wall time, the reads no longer
wait (the files came into the page cache) and the loads run inline again. Where the
samples' CPU is at least :data:`COMPUTES` of the *batches'* wall time, the threads may
only have taken turns, and the next batch runs inline, timed, as a trial: inline from
then on if it took no longer a sample than the threaded batches (:func:`inline_wins`), on
threads otherwise (a read that waits 5 ms before a 5 ms decode under the GIL: the trial
takes about three times as long). Reads that clearly waited never pay for a trial. The
order of the ``cpu`` stages, and so every result, is the same either way.

What a worker decided outlives it: the loader keeps each worker id's last decision, and
the next epoch's worker of that id starts from it: inline, or, where the loads went to
the threads (loads that slept, a trial lost), on its threads from its first batch,
measured as ever but never trying inline again (a trial costs a batch of serial reads).
Without that a loader without ``persistent_workers`` paid the serial batches that find a
wait every epoch. The threaded measure stays each sample's CPU clock: adding its time
runnable in a queue (read on the load threads) judged decodes on contended cores better,
but made the worker's freed-pages test fail 1 run in 8.

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
from typing import Any, NamedTuple

__all__ = [
    "ThreadClocks",
    "StageFailed",
    "StagedBatch",
    "computes",
    "inline_wins",
    "slept",
    "staged_steps",
    "thread_clocks",
    "verdict",
]

try:  # Linux's per-thread rusage: absent on macOS (the constant) and Windows (the module)
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD
except (ImportError, AttributeError):
    _RUSAGE_THREAD = None

_WHO = "torch_spdl.DataLoader"
WARMUP = 1  # a worker's first batches on the threads, not timed (they start the threads)
MEASURED = 2  # batches in a row that decide: inline ones that slept, threaded ones timed
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
        learned: what this worker id decided last epoch: False, start with the loads on
            the threads (no trial again); True, inline; None (nothing yet): as
            ``threads_first`` says.
        threads_first: with nothing learned, start the loads on the threads, timed (the
            user set ``io_concurrency``: they expect reads that wait); else inline.
    """

    def __init__(
        self,
        io: list[Step],
        cpu: list[Step],
        threads: int,
        learned: bool | None = None,
        threads_first: bool = False,
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
        # inline until MEASURED inline batches slept (module notes)
        self.inline = learned is True or (learned is None and not threads_first)
        self._trials = learned is not False  # a trial lost last epoch is not run again
        self.on_threads = False  # the last batch's io stages ran on the pool's threads
        self._decided: bool | None = learned  # the last decision (None: none yet)
        self._told: bool | None = learned  # the decision last given by :meth:`news`
        self._slept = 0  # inline batches in a row whose loads slept

    @classmethod
    def of(
        cls,
        dataset: Any,
        threads: int,
        learned: bool | None = None,
        threads_first: bool = False,
    ) -> StagedBatch | None:
        """The staged batches of ``dataset``, or None (run it as ``__getitem__``)."""
        steps = staged_steps(dataset)
        return None if steps is None else cls(*steps, threads, learned, threads_first)

    def news(self) -> bool | None:
        """The last decision (True: the loads run inline; False: on the threads, as they
        slept or lost a trial), when it changed since the last call (else None): what the
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
            began, clocks = time.perf_counter(), thread_clocks()
            out = [self._one(v, i) for v, i in zip(values, indices, strict=True)]
            wall = time.perf_counter() - began
            if self._trial:
                self._trial = False
                self.inline = self._decided = inline_wins(self._walls, (wall, len(values)))
                self._walls.clear()
            elif not slept(clocks, thread_clocks(), wall):
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


class ThreadClocks(NamedTuple):
    """A thread's clocks (:func:`thread_clocks`): its CPU time and its time runnable in a
    queue, seconds (None without ``/proc``), and its voluntary context switches (None
    without ``RUSAGE_THREAD``): each a time it blocked (a read, a lock)."""

    cpu: float
    queued: float | None
    blocks: int | None


def thread_clocks() -> ThreadClocks:
    """This thread's :class:`ThreadClocks`. The CPU time is the clock's, which is exact;
    ``schedstat``'s own counts a running thread's time only up to its last tick or switch
    (up to 4 ms behind), and its queue time comes in lumps: a worker's inline batch of 3 ms
    beside a training step gained 28 ms of it, the one before 27 ms of wall time without a
    block or a queue (2026-12-04), so the switches say whether a thread slept at all."""
    cpu = time.thread_time()
    blocks = resource.getrusage(_RUSAGE_THREAD).ru_nvcsw if _RUSAGE_THREAD is not None else None
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        try:
            fields = os.read(fd, 96).split()
        finally:
            os.close(fd)
        return ThreadClocks(cpu, int(fields[1]) / 1e9, blocks)
    except (OSError, ValueError, IndexError):
        return ThreadClocks(cpu, None, blocks)


def slept(before: ThreadClocks, after: ThreadClocks, wall: float) -> bool:
    """Whether a thread whose clocks went from ``before`` to ``after`` in ``wall`` seconds
    slept (neither ran nor waited for a core) more than ``1 - COMPUTES`` of that time:
    it blocked at least once, and its CPU and queue time (none known: 0) leave more than
    that. A thread that never blocked did not sleep, whatever the lumps of its queue
    clock say (no switch count: False, the loads stay where they are)."""
    if before.blocks is None or after.blocks is None or after.blocks == before.blocks:
        return False
    queued = 0.0 if before.queued is None or after.queued is None else after.queued - before.queued
    busy = after.cpu - before.cpu + max(0.0, queued)
    return wall > 0 and wall - busy > (1 - COMPUTES) * wall


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
