"""The messages of the process wire, as named types, and how a message is pickled.

Every process boundary of torch_spdl (``iterate_in_subprocess``,
``run_pipeline_in_subprocess``, a ``to()`` region's workers, a process-pool stage's chunks,
the DataLoader's worker processes) sends these, or types of its own built the same way:
a ``NamedTuple`` per kind of message, read by field name and told apart by its type, never
a tuple decoded by index or a magic number in a field. A ``NamedTuple`` pickles as its
class and its fields, 1-3 us more per message than a bare tuple through plain ``pickle``;
there is one message per item, chunk or batch (a chunk's outcomes are one message, not one
per item).

:func:`dumps` is the wire's pickle (:func:`send` and :func:`receive` use it): plain
``pickle`` at the highest protocol, not multiprocessing's pickler (``Connection.send``),
which would send a torch tensor as a handle to this process's memory (unreadable once the
process exited, or failing for a file-backed storage; here a tensor travels by value), and
which copies the whole ``copyreg`` dispatch table for every message. Measured (a
DataLoader task and its reply, pickled and unpickled; best of 9, three runs on the shared
2-core machine): 8.3-14.5 us as the bare tuples of before through ``Connection.send``,
5.8-9.2 us typed through :func:`send` and :func:`receive`, 15-27 us typed through
``Connection.send``: typed and sent plainly, a message costs less than the tuple it
replaced. :func:`pickle_error` says why something does not pickle: the one check used
before sending (a function to a child, an item that failed to cross).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from .errors import PortableError

__all__ = [
    "End",
    "Failed",
    "Items",
    "Outcomes",
    "Stop",
    "call_each",
    "dumps",
    "pickle_error",
    "receive",
    "send",
]


class Items(NamedTuple):
    """Values crossing, in order; ``run`` names the run they belong to (None: no runs)."""

    values: list[Any]
    run: int | None = None


class End(NamedTuple):
    """The end of a stream (of a run's items, or of a worker's input); ``failed``: the
    items the sender dropped on the way (counted against a failure budget)."""

    run: int | None = None
    failed: int = 0


class Failed(NamedTuple):
    """The sender failed with ``error``; ``run``: the run that failed (None: the child
    itself, before or outside any run)."""

    error: PortableError
    run: int | None = None


class Stop(NamedTuple):
    """No more work: the child finishes what it holds and exits."""


class Outcomes(NamedTuple):
    """What a chunk of items came to in a worker: each item's value (None where it
    failed) and the error of each item that failed, by its place in the chunk."""

    values: list[Any]
    errors: dict[int, Exception]

    @classmethod
    def not_sent(cls, items: list[Any], exc: Exception) -> Outcomes:
        """The chunk did not cross (or its outcomes did not come back): every item fails,
        an item that does not pickle with its own error, the others with ``exc``."""
        errors: dict[int, Exception] = {}
        for i, item in enumerate(items):
            errors[i] = pickle_error(item) or exc
        return cls([None] * len(items), errors)


def call_each(op: Callable[[Any], Any], items: list[Any]) -> Outcomes:
    """Run ``op`` on each item of a chunk (in a worker process), so that one bad item fails
    alone."""
    values: list[Any] = []
    errors: dict[int, Exception] = {}
    for i, item in enumerate(items):
        try:
            values.append(op(item))
        except Exception as exc:
            values.append(None)
            errors[i] = exc
    return Outcomes(values, errors)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for the wire: by value, at the highest protocol."""
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def send(conn: Connection, message: Any) -> None:
    """Send ``message`` on ``conn``, pickled by :func:`dumps`."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """The next message on ``conn`` (``EOFError`` once the other end closed)."""
    return pickle.loads(conn.recv_bytes())


def pickle_error(obj: Any) -> Exception | None:
    """Why ``obj`` cannot be pickled, or None when it can."""
    try:
        pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return exc
    return None
