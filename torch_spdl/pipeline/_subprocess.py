"""Run an iterable (or a whole pipeline) in a child process and stream its items back.

``iterate_in_subprocess``: the child sends the process wire's messages (``Items``, ``End``,
``Failed``; ``torch_spdl._procwire``) over a pipe; a semaphore of ``buffer_size`` slots
bounds how far it runs ahead. The parent waits on the pipe and on the child's exit
sentinel together (``Child.receive``), so a child that dies, even by ``os._exit``, is
reported at once instead of leaving the parent waiting for an item that never comes.

``run_pipeline_in_subprocess``, which keeps one child running a pipeline for every
iteration of its result, speaks the same wire in ``_subprocess_pipeline.py``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from .._procwire import (
    Child,
    ChildGone,
    End,
    Failed,
    Items,
    PortableError,
    pickle_error,
    send,
)

__all__ = ["SubprocessError", "check_picklable", "child_error", "iterate_in_subprocess"]

_LG = logging.getLogger("torch_spdl.pipeline")

T = TypeVar("T")


class SubprocessError(RuntimeError):
    """The child process died, or raised an error that could not be sent back."""


def check_picklable(caller: str, what: str, obj: Any, hint: str) -> None:
    """``TypeError`` naming ``what`` if ``obj`` cannot be pickled to reach the child."""
    error = pickle_error(obj)
    if error is not None:
        raise TypeError(
            f"{caller}: {what} cannot be pickled to send to the child process ({error}); {hint}"
        ) from error


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
                send(conn, Items([item]))
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # a generator's cleanup (a pipeline's stop) runs now
                close()
        send(conn, End())
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        if stop.is_set():
            return
        send(conn, Failed(PortableError.of(exc)))
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
    hint = "use a module-level function or functools.partial"
    for what, obj in (("fn", fn), ("initializer", initializer)):
        check_picklable("iterate_in_subprocess", f"{what}={obj!r}", obj, hint)
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
    child = Child.start(
        ctx,
        _child_main,
        (fn, initializer, writer, slots, stop),
        name="torch_spdl-subprocess",
        daemon=daemon,
        child_ends=[writer],
        ends=[reader],
    )
    try:
        while True:
            try:
                message = child.receive(reader, timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no item arrived from the subprocess within {timeout} s"
                ) from None
            except ChildGone as gone:
                how = "closed its pipe and exited" if gone.closed_pipe else "exited unexpectedly"
                raise SubprocessError(
                    f"the subprocess (pid {child.pid}) running {fn!r} {how} "
                    f"with code {child.exitcode}"
                ) from None
            if isinstance(message, Items):
                slots.release()
                yield from message.values
            elif isinstance(message, End):
                return
            else:
                raise child_error(message, child)
    finally:
        stop.set()
        slots.release()  # unblock a child waiting for a slot, so it sees `stop`
        child.close_pipes()
        child.stop(10)


def child_error(message: Failed, child: Child) -> BaseException:
    """The child's error, rebuilt here and noted with where it was raised."""
    error = message.error.rebuild("subprocess", SubprocessError)
    error.add_note(f"torch_spdl: raised in the subprocess (pid {child.pid})")
    return error
