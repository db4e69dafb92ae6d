"""Task hooks: SPDL's extension point around every task and every stage.

A :class:`TaskHook` provides two async context managers: ``stage_hook()`` wraps a stage's
whole run, ``task_hook(input_item)`` wraps one task (one call of the op; one step of a
generator op). ``build(task_hook_factory=...)`` makes the hooks of each stage from its
:class:`StageInfo`.

Hooks are opt-in, and a stage without hooks runs exactly the loop it runs without this
module: the hooks wrap the op once per worker (as tracing does), so the per-item path of an
unhooked stage has no extra call, check or allocation. A sync stage's worker thread runs
its task hooks on an event loop of its own, since hooks are async but the thread is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "StageInfo",
    "TaskHook",
    "TaskPerfStats",
    "TaskStatsHook",
    "check_hooks",
    "hooked_async",
    "hooked_sync",
]

_LG = logging.getLogger("torch_spdl.pipeline")


@dataclass(frozen=True, init=False)
class StageInfo:
    """What a ``task_hook_factory`` learns about the stage it makes hooks for.

    ``name`` is the stage's name as in ``get_stats()`` (``"2:decode"``), ``index`` its
    position (1 for the first stage after the source), ``stage_id`` the ``stage_id`` given
    to ``build``. SPDL 0.8 describes a stage by ``pipeline_id``, ``stage_id`` and
    ``stage_name`` (and ``concurrency``); those keywords are accepted too, and
    ``stage_name`` reads the name, so a hook written for either works.

    Args:
        name: the stage's name (``stage_name=`` in SPDL's spelling).
        index: the stage's position.
        stage_id: the ``stage_id`` given to ``build``.
        pipeline_id: which pipeline of the process (SPDL's field).
        concurrency: the stage's concurrency, when known (SPDL's field).
    """

    name: str
    index: int
    stage_id: int | str
    pipeline_id: int
    concurrency: int | None

    def __init__(
        self,
        name: str | None = None,
        index: int = 0,
        stage_id: int | str = 0,
        *,
        pipeline_id: int = 0,
        stage_name: str | None = None,
        concurrency: int | None = None,
    ) -> None:
        if name is None:
            if stage_name is None:
                raise TypeError("StageInfo needs the stage's name (name= or stage_name=)")
            name = stage_name
        for field, value in (
            ("name", name),
            ("index", index),
            ("stage_id", stage_id),
            ("pipeline_id", pipeline_id),
            ("concurrency", concurrency),
        ):
            object.__setattr__(self, field, value)

    @property
    def stage_name(self) -> str:
        """The stage's name (SPDL's spelling of :attr:`name`)."""
        return self.name

    def __str__(self) -> str:
        return self.name


class TaskHook(ABC):
    """Base class of hooks: override :meth:`task_hook` (and optionally :meth:`stage_hook`).

    Both must be async context managers (decorate them with
    ``contextlib.asynccontextmanager``); ``build`` checks this. An error raised by
    ``stage_hook`` fails the pipeline; one raised by ``task_hook`` fails that item only (it
    is dropped and counted against ``max_failures``). When the op is an async generator,
    ``StopAsyncIteration`` passes through ``task_hook`` at its end: re-raise it.
    """

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        """Wraps the stage's whole run (entered before its first item, left after its last)."""
        yield

    @abstractmethod
    def task_hook(self, input_item: Any = None) -> contextlib.AbstractAsyncContextManager[None]:
        """Wraps one task; ``input_item`` is the item the task works on.

        Args:
            input_item: the input of the op call (for a generator op, of the whole call).
        """


@dataclass(frozen=True)
class TaskPerfStats:
    """What :class:`TaskStatsHook` measured: tasks run, failed, and the mean time of the
    successful ones (seconds)."""

    num_tasks: int
    num_failures: int
    ave_time: float


class TaskStatsHook(TaskHook):
    """Counts a stage's tasks and times the successful ones; logs them when the stage ends,
    and every ``interval`` seconds while it runs.

    The periodic report covers the tasks since the previous one and goes to
    :meth:`interval_stats_callback` (override it to send the figures elsewhere; by default
    it logs them). It is made by a thread of the hook's own, started when the stage starts
    and joined when it ends, since a sync stage runs its hooks on worker threads, not on an
    event loop that keeps running.

    Args:
        info: the stage.
        interval: seconds between periodic reports; 0 or less: none (default).
    """

    def __init__(self, info: StageInfo | str, interval: float = -1) -> None:
        self.info = info
        self.interval = interval
        self.num_tasks = 0
        self.num_success = 0
        self.ave_time = 0.0
        self._lap = TaskPerfStats(0, 0, 0.0)  # the totals at the previous periodic report
        # a sync stage's workers are threads, each running this hook: count under a lock
        self._lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def stage_hook(self) -> AsyncIterator[None]:
        done = threading.Event()
        reporter = None
        if self.interval > 0:
            reporter = threading.Thread(
                target=self._report_every_interval,
                args=(done,),
                name=f"torch_spdl-task-stats-{self.info}",
                daemon=True,
            )
            reporter.start()
        try:
            yield
        finally:
            done.set()
            if reporter is not None:
                reporter.join()
            self._log(self.stats(), "completed")

    def _report_every_interval(self, done: threading.Event) -> None:
        while not done.wait(self.interval):
            try:
                asyncio.run(self._log_interval_stats())
            except Exception:  # a report must never take the stage down
                _LG.exception("[%s] the periodic task-stats report failed", self.info)

    async def _log_interval_stats(self) -> None:
        """One periodic report: the tasks since the previous one."""
        await self.interval_stats_callback(self._lap_stats())

    def _lap_stats(self) -> TaskPerfStats:
        with self._lock:
            total, success, ave = self.num_tasks, self.num_success, self.ave_time
        last = self._lap
        last_success = last.num_tasks - last.num_failures
        tasks, successes = total - last.num_tasks, success - last_success
        lap_ave = (ave * success - last.ave_time * last_success) / successes if successes else 0.0
        self._lap = TaskPerfStats(total, total - success, ave)
        return TaskPerfStats(tasks, tasks - successes, max(lap_ave, 0.0))

    async def interval_stats_callback(self, stats: TaskPerfStats) -> None:
        """Receives each periodic report (the tasks since the previous one); logs it.

        Args:
            stats: the figures of the interval.
        """
        self._log(stats, "in the last interval")

    def _log(self, stats: TaskPerfStats, when: str) -> None:
        _LG.info(
            "[%s] %s %d tasks (%d failed), mean task time %.3g s",
            self.info,
            when,
            stats.num_tasks,
            stats.num_failures,
            stats.ave_time,
        )

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        except StopAsyncIteration:  # a generator's end is not a task
            raise
        except BaseException:
            with self._lock:
                self.num_tasks += 1
            raise
        elapsed = time.perf_counter() - t0
        with self._lock:
            self.num_tasks += 1
            self.num_success += 1
            self.ave_time += (elapsed - self.ave_time) / self.num_success

    def stats(self) -> TaskPerfStats:
        """The counts so far."""
        with self._lock:
            return TaskPerfStats(self.num_tasks, self.num_tasks - self.num_success, self.ave_time)


def check_hooks(hooks: Sequence[Any], stage: str) -> list[TaskHook]:
    """Validate a stage's hooks at build time: each must give async context managers."""
    checked = []
    for hook in hooks:
        for method in ("stage_hook", "task_hook"):
            fn = getattr(hook, method, None)
            cm = fn() if callable(fn) else None
            if not (hasattr(cm, "__aenter__") and hasattr(cm, "__aexit__")):
                raise ValueError(
                    f"stage {stage!r}: hook {hook!r}: {method}() must return an async context "
                    "manager (decorate it with contextlib.asynccontextmanager)"
                )
        checked.append(hook)
    return checked


@contextlib.asynccontextmanager
async def _task(hooks: Sequence[TaskHook], item: Any) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for hook in hooks:
            await stack.enter_async_context(hook.task_hook(item))
        yield


def hooked_async(op: Callable[[Any], Any], hooks: Sequence[TaskHook], generator: bool) -> Any:
    """``op`` (async function or async generator function) with the task hooks around each
    task: each call, or each ``anext()`` of a generator. The op itself is called at once,
    so an op that cannot be called raises there, as the unhooked op does."""
    if not generator:

        async def run(coro: Any, item: Any) -> Any:
            try:
                async with _task(hooks, item):
                    return await coro
            finally:
                coro.close()  # never awaited when a hook failed on entry

        return lambda item: run(op(item), item)

    async def steps(it: Any, item: Any) -> AsyncIterator[Any]:
        while True:
            ended = False
            try:
                async with _task(hooks, item):
                    try:
                        out = await it.__anext__()
                    except StopAsyncIteration:
                        ended = True
                        raise
            except StopAsyncIteration:
                return
            if ended:  # a hook swallowed the end: stop anyway
                return
            yield out

    return lambda item: steps(op(item), item)


def hooked_sync(
    op: Callable[[Any], Any], hooks: Sequence[TaskHook], generator: bool
) -> tuple[Callable[[Any], Any], Callable[[], None]]:
    """``op`` (function or generator function) with the task hooks around each task, run on
    an event loop private to the calling worker thread; returns it and the loop's closer."""
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    if not generator:

        async def task(item: Any) -> Any:
            async with _task(hooks, item):
                return op(item)

        return (lambda item: run(task(item))), loop.close

    _end = object()

    async def step(it: Iterator[Any], item: Any) -> Any:
        ended = False
        try:
            async with _task(hooks, item):
                try:
                    return next(it)
                except StopIteration:
                    ended = True
                    raise StopAsyncIteration from None
        except StopAsyncIteration:
            return _end
        return _end if ended else None  # reached only when a hook swallowed the end

    def gen(item: Any) -> Iterator[Any]:
        it = iter(op(item))
        while (out := run(step(it, item))) is not _end:
            yield out

    return gen, loop.close
