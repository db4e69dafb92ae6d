"""Run an iterable (or a whole pipeline) in a child process and stream its items back.

``iterate_in_subprocess``: the child sends ``(tag, payload)`` messages over a pipe; a
semaphore of ``buffer_size`` slots bounds how far it runs ahead. The parent waits on the
pipe and on the child's exit sentinel together, so a child that dies, even by
``os._exit``, is reported at once instead of leaving the parent waiting for an item that
never comes.

``run_pipeline_in_subprocess``, which keeps one child running a pipeline for every
iteration of its result, is built on the same messages in ``_subprocess_pipeline.py``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

__all__ = ["ITEM", "END", "ERROR", "SubprocessError", "iterate_in_subprocess"]

_LG = logging.getLogger("torch_spdl.pipeline")

T = TypeVar("T")

ITEM, END, ERROR = 0, 1, 2  # the tag of each message from a child


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
                conn.send_bytes(pickle.dumps((ITEM, item), pickle.HIGHEST_PROTOCOL))
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # a generator's cleanup (a pipeline's stop) runs now
                close()
        conn.send((END, None))
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        if stop.is_set():
            return
        try:
            conn.send((ERROR, exc))
        except Exception:  # unpicklable exception: send its text instead
            conn.send((ERROR, SubprocessError("".join(traceback.format_exception(exc)))))
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

    An error in the child is re-raised here; a child that dies raises
    :class:`SubprocessError`. Closing the iterator early stops and joins the child.

    Args:
        fn: makes the iterable, in the child; it must be picklable (a module-level function
            or a ``functools.partial`` of one).
        buffer_size: the most items in flight between the child and here.
        initializer: run first in the child (picklable too).
        mp_context: how to start the child (``spawn`` by default).
        timeout: the most seconds to wait for each item (``TimeoutError``).
        daemon: ``False`` lets the child start processes of its own (a daemonic process
            may not); it is joined all the same.
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
            if tag == ITEM:
                slots.release()
                yield payload
            elif tag == END:
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
