"""A child process and the parent's ends of its pipes: started, waited on, stopped, reaped.

Every process boundary starts its children the same way (:meth:`Child.start`: the context
the caller names, ``fork`` where the boundary relies on inheritance, the child's pipe ends
closed in the parent right after the start, so that a child's death reaches the parent as
the end of its pipe; or made of a process that its owner forks from a frame of its
choosing, closing those ends itself), and waits the same way: on the pipe *and* on the
process's exit sentinel together (:meth:`Child.receive` for one child, :class:`Watch` for
many), so a child that dies, even by ``os._exit`` or a signal, is reported at once with its
exit code instead of leaving the parent waiting for a message that never comes. Stopping is
one sequence too (:meth:`Child.stop`): a grace period to exit, then ``terminate``, then
``kill``; the process is reaped, and where the caller releases the process object its exit
code is kept, so the :class:`Child` still answers what torch's iterator shows of a worker
(``pid``, ``exitcode``, ``is_alive()``, ``join()``, ``terminate()``).

:class:`Sender` writes to children's pipes on a thread of its own (the DataLoader's
workers; the reason, measured, is in ``data/_workers/process_pool.py``).
"""

from __future__ import annotations

import math
import queue
import select
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, NamedTuple, TypeVar

from .messages import receive, send

__all__ = ["Child", "ChildGone", "Sender", "WaitResult", "Watch"]

K = TypeVar("K")


class ChildGone(Exception):
    """The child exited, or closed its pipe, while the parent waited for a message."""

    def __init__(self, child: Child, closed_pipe: bool) -> None:
        super().__init__(f"the child process (pid {child.pid}) exited with code {child.exitcode}")
        self.child = child
        self.closed_pipe = closed_pipe


class Child:
    """A child process and the parent's ends of its pipes (see :meth:`close_pipes`): started
    by :meth:`start`, or made of a process object that its owner starts (until then it has
    no pid, and :meth:`stop` has nothing to do)."""

    def __init__(self, process: Any, ends: Sequence[Connection] = ()) -> None:
        self.process = process
        self.ends = list(ends)
        self._pid: int | None = process.pid
        self._exitcode: int | None = None  # kept once the process object is closed

    @classmethod
    def start(
        cls,
        ctx: Any,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        name: str,
        daemon: bool = True,
        child_ends: Iterable[Connection] = (),
        ends: Sequence[Connection] = (),
    ) -> Child:
        """Start ``target(*args)`` in a process of ``ctx``; close ``child_ends`` here (they
        live on in the child), keep ``ends`` (the parent's) for :meth:`close_pipes`."""
        process = ctx.Process(target=target, args=args, name=name, daemon=daemon)
        process.start()
        for end in child_ends:
            end.close()
        return cls(process, ends)

    @property
    def pid(self) -> int | None:
        """The process id (None until started); still known once the process is closed."""
        if self._pid is None and self._exitcode is None:
            self._pid = self.process.pid
        return self._pid

    @property
    def sentinel(self) -> int:
        return int(self.process.sentinel)

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is not None:
            return self._exitcode
        try:
            return self.process.exitcode
        except ValueError:  # closed
            return self._exitcode

    @property
    def signal(self) -> signal.Signals | None:
        """The signal that ended the process, if one did."""
        code = self.exitcode
        return signal.Signals(-code) if code is not None and code < 0 else None

    def _call(self, method: str, *args: Any) -> Any:
        if self.pid is None:  # never started
            return None
        try:
            return getattr(self.process, method)(*args)
        except ValueError:  # closed: stopped and reaped already
            return None

    def is_alive(self) -> bool:
        return self.exitcode is None and bool(self._call("is_alive"))

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is None:
            self._call("join", timeout)

    def terminate(self) -> None:
        if self.exitcode is None:
            self._call("terminate")

    def receive(self, conn: Connection, timeout: float | None) -> Any:
        """The next message on ``conn`` (plainly pickled); ``TimeoutError`` after
        ``timeout`` seconds, :class:`ChildGone` if the child exits first."""
        ready = wait([conn, self.process.sentinel], timeout)
        if not ready:
            raise TimeoutError(f"no message arrived from the child process within {timeout} s")
        if conn not in ready:  # exited without a word
            self.process.join()
            raise ChildGone(self, closed_pipe=False)
        try:
            return receive(conn)
        except EOFError:
            self.process.join()
            raise ChildGone(self, closed_pipe=True) from None

    def stop(
        self,
        grace: float,
        *,
        kill_at_once: bool = False,
        term_grace: float = 10.0,
        release: bool = False,
    ) -> None:
        """Give the child ``grace`` seconds to exit, then ``terminate`` it (with
        ``term_grace`` seconds more) or, with ``kill_at_once``, ``kill`` it, and reap it;
        with ``release``, close the process object too (its exit code stays readable
        here). A child that exited is only reaped."""
        if self._exitcode is not None or self.pid is None:  # reaped, or never started
            return
        process = self.process
        try:
            process.join(grace)
            if process.is_alive() and not kill_at_once:
                process.terminate()
                process.join(term_grace)
            if process.is_alive():
                process.kill()
                process.join()
            if release:
                self._exitcode = process.exitcode
                process.close()
        except ValueError:  # closed already
            pass

    def close_pipes(self) -> None:
        """Close the parent's ends of the child's pipes (once nothing uses them)."""
        for end in self.ends:
            end.close()


class WaitResult(NamedTuple, Generic[K]):
    """What one wait of a :class:`Watch` found: the keys whose pipe has something to read
    (or has closed), and those whose process exited."""

    readable: list[K]
    exited: list[K]


class Watch(Generic[K]):
    """One wait on many children: their pipes and their exits, and a pipe that wakes it.

    Each child is added under a key (the caller's record of it); a pipe that closed, or a
    child whose exit was reported, is forgotten, so each is reported once. The descriptors
    stay registered with one ``poll`` object between waits: ``multiprocessing``'s
    ``wait()`` builds a selector and registers every descriptor anew on each call (about
    60 us of the DataLoader's main thread a batch under cProfile, the loader alone).
    Waits, additions and forgetting happen in one thread at a time (the receiver, or the
    thread that asks for a batch).
    """

    def __init__(self, wake: Connection | None = None) -> None:
        self._wake = wake
        self._pipes: dict[Connection, K] = {}
        self._exits: dict[int, K] = {}
        self._poll = select.poll()
        self._fds: dict[int, Connection | int] = {}  # descriptor -> the pipe, or a sentinel
        if wake is not None:
            self._register(wake.fileno(), wake)

    def add(self, key: K, pipe: Connection, child: Child) -> None:
        self._pipes[pipe] = key
        self._exits[child.sentinel] = key
        self._register(pipe.fileno(), pipe)
        self._register(child.sentinel, child.sentinel)

    def watching(self, pipe: Connection) -> bool:
        return pipe in self._pipes

    def forget(self, pipe: Connection) -> None:
        """Stop reading ``pipe`` (it closed: its child's exit will tell why)."""
        if self._pipes.pop(pipe, None) is not None:
            self._unregister(pipe)

    def wait(self, timeout: float | None) -> WaitResult[K] | None:
        """What is ready within ``timeout`` seconds (both lists empty if nothing); None
        when the wake pipe was written."""
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        ready = [self._fds[fd] for fd, _ in self._poll.poll(ms) if fd in self._fds]
        if self._wake is not None and self._wake in ready:
            return None
        pipes, exits = self._pipes, self._exits
        sentinels = [r for r in ready if r in exits]
        for sentinel in sentinels:  # an exit is reported once
            self._unregister(sentinel)
        readable = [pipes[r] for r in ready if r in pipes]
        return WaitResult(readable, [exits.pop(r) for r in sentinels])

    def _register(self, fd: int, what: Connection | int) -> None:
        self._fds[fd] = what
        self._poll.register(fd, select.POLLIN)

    def _unregister(self, what: Connection | int) -> None:
        for fd, known in list(self._fds.items()):
            if known is what:
                del self._fds[fd]
                self._poll.unregister(fd)


class Sender:
    """Sends messages to children's pipes, in order, from a thread of its own."""

    def __init__(self, name: str) -> None:
        # (pipe, message) to send; None ends the thread
        self._queue: queue.SimpleQueue[tuple[Connection, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, pipe: Connection, message: Any) -> None:
        self._queue.put((pipe, message))

    def finish(self) -> None:
        """Send what was queued, then end the thread (:meth:`join` waits for it)."""
        self._queue.put(None)

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            pipe, message = item
            try:
                send(pipe, message)
            except (OSError, ValueError):
                pass  # the child is gone: its exit is reported where its pipe is read
