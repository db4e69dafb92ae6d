"""What the loader sends its worker processes: their tasks, then ``Stop``.

Tasks go through one sender thread (the wire's ``Sender``), as torch's index queue goes
through its feeder thread, and not from the thread that submits them. A pipe write wakes
the worker as "the writer is about to sleep", and Linux then queues the worker on the
writer's core; but the training loop writes and goes on with its step, so the worker either
waits for that core or takes it from the step while the other core idles. The sender sleeps
right after its write. Measured on 2 cores, a step of 2 ms of Python then 8 ms waiting, 256
path strings a batch: 176 of 400 steps ran 1-2 ms late when the loop wrote the tasks
itself, 0 of 400 through the sender (21.5k against 23.5k samples/s; torch 22.9k).

A worker's first message is the exception: the submitting thread writes it itself, and
the epoch's first batches start as each worker is forked instead of once the sender thread
has started and woken (about 10 ms of an epoch's start on 2 cores, where that thread's
start waits for a core that the new workers hold). It is written so only when it fits in
the empty pipe (64 KiB on Linux), so that the write completes at once whatever the worker
is doing (still in ``worker_init_fn``, stuck): a thread blocked in a write could not honour
the loader's ``timeout``. The sender thread is made at the first message that needs it, and
every later message goes through it, so each pipe's messages keep their order.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from typing import Any

from ..._procwire import Sender, Stop, encode

__all__ = ["Outbox"]

# A first message this small (with its 4-byte length, or 8 past 2 GiB) fits in an empty
# pipe: Linux pipes hold 64 KiB.
_FITS_EMPTY_PIPE = 60_000


class Outbox:
    """Messages to worker processes' task pipes, in order per pipe (see the module's doc)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._sender: Sender | None = None
        self._written: set[Connection] = set()  # pipes written before the sender existed
        self._stopped: set[Connection] = set()  # pipes with their Stop sent
        # The submitting thread and the one that stops the workers may both send.
        self._lock = threading.Lock()
        self._finished = False

    def send(self, pipe: Connection, message: Any) -> None:
        """Send ``message`` after what was sent to ``pipe`` before (nothing once
        :meth:`finish` was called: the workers are being stopped)."""
        with self._lock:
            if self._finished:
                return
            if self._sender is None and pipe not in self._written:  # its first message
                self._written.add(pipe)
                data = encode(message)
                if len(data) <= _FITS_EMPTY_PIPE:
                    try:
                        pipe.send_bytes(data)
                    except (OSError, ValueError):
                        pass  # the worker is gone: its exit is reported where its pipe is read
                    return
            if self._sender is None:
                self._sender = Sender(self._name)
            self._sender.send(pipe, message)

    def stop(self, pipe: Connection) -> None:
        """Send ``Stop`` after what was sent to ``pipe`` (once: again does nothing)."""
        with self._lock:
            if pipe in self._stopped:
                return
            self._stopped.add(pipe)
        self.send(pipe, Stop())

    def stopped(self, pipe: Connection) -> bool:
        """Whether ``pipe``'s worker was told to stop (it exits once its tasks are done)."""
        return pipe in self._stopped

    def finish(self) -> None:
        """Send what was queued, then end the sender thread (:meth:`join` waits for it)."""
        with self._lock:
            self._finished = True
            sender = self._sender
        if sender is not None:
            sender.finish()

    def join(self) -> None:
        with self._lock:
            sender = self._sender
        if sender is not None:
            sender.join()
