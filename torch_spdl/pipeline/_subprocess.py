"""Run an iterable (or a whole pipeline) in a child process and stream its items back.

The child sends ``(tag, payload)`` messages over a pipe; a semaphore of ``buffer_size``
slots bounds how far it runs ahead. The parent waits on the pipe and on the child's exit
sentinel together, so a child that dies, even by ``os._exit``, is reported at once instead
of leaving the parent waiting for an item that never comes.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import pickle
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from ._builder import PipeConfig, PipelineBuilder, PipelineConfig, build_pipeline

__all__ = ["iterate_in_subprocess", "run_pipeline_in_subprocess", "SubprocessError"]

_LG = logging.getLogger("torch_spdl.pipeline")

T = TypeVar("T")

_ITEM, _END, _ERROR = 0, 1, 2


class SubprocessError(RuntimeError):
    """The child process died, or raised an error that could not be sent back."""


def _child_main(
    fn: Callable[[], Iterable[Any]],
    initializer: Callable[[], None] | None,
    conn: Connection,
    slots: Any,
    stop: Any,
) -> None:
    try:
        if initializer is not None:
            initializer()
        items = fn()
        try:
            for item in items:
                slots.acquire()
                if stop.is_set():
                    return
                # Plain pickle (by value): multiprocessing's pickler would send a torch tensor
                # as a handle to this process's memory, unreadable once this process exited.
                conn.send_bytes(pickle.dumps((_ITEM, item), pickle.HIGHEST_PROTOCOL))
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # a generator's cleanup (a pipeline's stop) runs now
                close()
        conn.send((_END, None))
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        if stop.is_set():
            return
        try:
            conn.send((_ERROR, exc))
        except Exception:  # unpicklable exception: send its text instead
            conn.send((_ERROR, SubprocessError("".join(traceback.format_exception(exc)))))
    finally:
        conn.close()


def iterate_in_subprocess(
    fn: Callable[[], Iterable[T]],
    *,
    buffer_size: int = 3,
    initializer: Callable[[], None] | None = None,
    mp_context: str | None = "spawn",
    timeout: float | None = None,
    daemon: bool = True,
) -> Iterator[T]:
    """Call ``fn()`` in a child process, iterate its result there, yield the items here.

    ``fn`` (and ``initializer``, run first in the child) must be picklable: a module-level
    function or a ``functools.partial`` of one. At most ``buffer_size`` items are in flight.
    ``timeout`` bounds the wait for each item (``TimeoutError``). An error in the child is
    re-raised here; a child that dies raises :class:`SubprocessError`. Closing the iterator
    early stops and joins the child. ``daemon=False`` lets the child start processes of
    its own (a daemonic process may not); it is joined all the same.
    """
    ctx = mp.get_context(mp_context)
    for what, obj in (("fn", fn), ("initializer", initializer)):
        try:
            pickle.dumps(obj)
        except Exception as exc:
            raise TypeError(
                f"iterate_in_subprocess: {what}={obj!r} cannot be pickled to send to the child "
                f"process ({exc}); use a module-level function or functools.partial"
            ) from exc
    return _stream(ctx, fn, initializer, max(buffer_size, 1), timeout, daemon)


def _stream(
    ctx: Any,
    fn: Callable[[], Iterable[T]],
    initializer: Callable[[], None] | None,
    buffer_size: int,
    timeout: float | None,
    daemon: bool = True,
) -> Iterator[T]:
    reader, writer = ctx.Pipe(duplex=False)
    slots = ctx.Semaphore(buffer_size)
    stop = ctx.Event()
    proc = ctx.Process(
        target=_child_main,
        args=(fn, initializer, writer, slots, stop),
        daemon=daemon,
        name="torch_spdl-subprocess",
    )
    proc.start()
    writer.close()
    try:
        while True:
            ready = wait([reader, proc.sentinel], timeout)
            if not ready:
                raise TimeoutError(f"no item arrived from the subprocess within {timeout} s")
            if reader not in ready:  # exited without a word
                proc.join()
                raise SubprocessError(
                    f"the subprocess (pid {proc.pid}) running {fn!r} exited unexpectedly "
                    f"with code {proc.exitcode}"
                )
            try:
                tag, payload = reader.recv()
            except EOFError:
                proc.join()
                raise SubprocessError(
                    f"the subprocess (pid {proc.pid}) running {fn!r} closed its pipe and "
                    f"exited with code {proc.exitcode}"
                ) from None
            if tag == _ITEM:
                slots.release()
                yield payload
            elif tag == _END:
                return
            else:
                payload.add_note(f"torch_spdl: raised in the subprocess (pid {proc.pid})")
                raise payload
    finally:
        stop.set()
        slots.release()  # unblock a child waiting for a slot, so it sees `stop`
        reader.close()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()


class _PoolSpec:
    """A picklable stand-in for a user's thread or process pool: an executor cannot cross
    a process boundary, so the child makes an equal one (same kind, same size)."""

    def __init__(self, executor: Executor) -> None:
        if isinstance(executor, ProcessPoolExecutor):
            self.kind = "process"
        elif isinstance(executor, ThreadPoolExecutor):
            self.kind = "thread"
        else:
            raise TypeError(
                f"run_pipeline_in_subprocess: executor {executor!r} cannot be sent to the "
                "subprocess; use a ThreadPoolExecutor or ProcessPoolExecutor (recreated there)"
            )
        self.max_workers: int | None = getattr(executor, "_max_workers", None)

    def create(self) -> Executor:
        if self.kind == "thread":
            return ThreadPoolExecutor(self.max_workers, thread_name_prefix="torch_spdl-pool")
        # the child runs threads: its worker processes must not be forked from it
        return ProcessPoolExecutor(self.max_workers, mp_context=mp.get_context("spawn"))


def _portable(config: Any) -> PipelineConfig:
    """``config`` (either kind of ``PipelineConfig``) with its executors made picklable."""
    to_builder_config = getattr(config, "_to_builder_config", None)
    if to_builder_config is not None:
        config = to_builder_config()
    stages = [
        dataclasses.replace(s, executor=_PoolSpec(s.executor))  # type: ignore[arg-type]
        if isinstance(s, PipeConfig) and s.executor is not None
        else s
        for s in config.stages
    ]
    return PipelineConfig(config.source, stages, config.buffer_size)


class _BuildAndIterate:
    """Picklable factory: builds the pipeline in the child (with its own pools) and
    iterates it."""

    def __init__(self, config: PipelineConfig, build_kwargs: dict[str, Any]) -> None:
        self.config = config
        self.build_kwargs = build_kwargs

    def __call__(self) -> Iterator[Any]:
        pools: list[Executor] = []
        stages = []
        for s in self.config.stages:
            if isinstance(s, PipeConfig) and isinstance(s.executor, _PoolSpec):
                pools.append(s.executor.create())
                s = dataclasses.replace(s, executor=pools[-1])
            stages.append(s)
        config = PipelineConfig(self.config.source, stages, self.config.buffer_size)
        try:
            pipeline = build_pipeline(config, **self.build_kwargs)
            with pipeline.auto_stop():
                yield from pipeline
        finally:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)


class _InSubprocess(Iterable[T]):
    """What ``run_pipeline_in_subprocess`` returns: each iteration runs the pipeline in a
    child process of its own, so the iterable can be iterated again (an epoch each)."""

    def __init__(self, factory: _BuildAndIterate, kwargs: dict[str, Any]) -> None:
        self._factory = factory
        self._kwargs = kwargs

    def __iter__(self) -> Iterator[T]:
        return iterate_in_subprocess(self._factory, **self._kwargs)


def run_pipeline_in_subprocess(
    config: Any,
    *,
    buffer_size: int = 3,
    initializer: Callable[[], None] | None = None,
    mp_context: str | None = "spawn",
    timeout: float | None = None,
    **build_kwargs: Any,
) -> Iterable[Any]:
    """Build the pipeline ``config`` declares in a child process, run it there, and
    yield its items here.

    Thread and process pools given to ``pipe(executor=...)`` are recreated in the child
    (same kind and size). The result can be iterated again: each iteration runs a fresh
    pipeline in a fresh child process.

    Args:
        config: a ``PipelineConfig`` (``torch_spdl.pipeline.defs.PipelineConfig``, or
            ``PipelineBuilder.get_config()``). Passing a ``PipelineBuilder`` still works
            and is deprecated.
        buffer_size: items in flight between the child and here.
        initializer: run first in the child.
        mp_context: how to start the child (``spawn`` by default).
        timeout: the most seconds to wait for each item (``TimeoutError``).
        build_kwargs: passed to ``build_pipeline`` in the child (``num_threads``,
            ``max_failures``...).
    """
    if isinstance(config, PipelineBuilder):
        warnings.warn(
            "run_pipeline_in_subprocess(builder) is deprecated: pass builder.get_config()",
            DeprecationWarning,
            stacklevel=2,
        )
        config = config.get_config()
    factory = _BuildAndIterate(_portable(config), build_kwargs)
    has_process_pool = any(
        isinstance(s, PipeConfig) and getattr(s.executor, "kind", None) == "process"
        for s in factory.config.stages
    )
    kwargs = dict(
        buffer_size=buffer_size,
        initializer=initializer,
        mp_context=mp_context,
        timeout=timeout,
        daemon=not has_process_pool,  # a daemonic child may not start the pool's processes
    )
    iterate_in_subprocess(factory, **kwargs).close()  # check now that it all pickles
    return _InSubprocess(factory, kwargs)
