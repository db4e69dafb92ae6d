"""The messages of the process wire, as named types, and how a message is pickled.

Every process boundary of torch_spdl (``iterate_in_subprocess``,
``run_pipeline_in_subprocess``, a ``to()`` region's workers, a process-pool stage's chunks,
the DataLoader's worker processes) sends these, or types of its own built the same way:
a ``NamedTuple`` per kind of message, read by field name and told apart by its type, never
a tuple decoded by index or a magic number in a field. There is one message per item, chunk
or batch (a chunk's outcomes are one message, not one per item).

**A message costs about what a tuple costs.** Pickled as it is, a ``NamedTuple`` costs
several times a bare tuple of its fields, both ways: the pickler names its class by module
and qualified name and checks that name by importing and walking it, and calls the class's
Python ``__getnewargs__``; the unpickler calls its Python ``__new__``. Two messages cross
per batch of a DataLoader (a task and its reply), each pickled once and unpickled once, on
the training thread, its sender thread or a worker. So :func:`encode` writes a
``NamedTuple`` message as a *frame*: one marker byte, then its class's name and its fields
as a plain tuple, pickled; :func:`decode` finds the class by that name (imported once per
class and process, then read from a table) and makes the message from its fields without a
Python call (``tuple.__new__``; a message type therefore has no ``__new__`` of its own to
run). Measured on the task and the reply (``LoadBatch``, ``BatchWritten``; min of 7
repeats, 3 alternations, 2026-12-02 on the shared 2-core machine): a frame costs 1.4-1.7 us
to write and 1.6-2.2 us to read, the ``NamedTuple`` pickled plainly 4.2-6.4 and 3.0-3.8,
a bare tuple of the same fields 0.5-0.9 and 0.5-0.6. The message is the same named type
at both ends, and nothing outside :func:`decode` reads a field by its place. Anything else
(and a message pickled by :func:`dumps`) travels as a plain pickle, which :func:`decode`
tells from a frame by its first byte.

:func:`dumps` is the wire's pickle (a frame's, and a payload's inside a message): plain
``pickle`` at the highest protocol, not multiprocessing's pickler (``Connection.send``),
which would send a torch tensor as a handle to this process's memory (unreadable once the
process exited, or failing for a file-backed storage; here a tensor travels by value), and
which copies the whole ``copyreg`` dispatch table for every message (a DataLoader task and
its reply cost 15-27 us through ``Connection.send``, against 5.8-9.2 us pickled plainly,
before frames; 2026-11-26). :func:`pickle_error` says why something does not pickle: the one
check used before sending (a function to a child, an item that failed to cross).
"""

from __future__ import annotations

import importlib
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
    "decode",
    "dumps",
    "encode",
    "pickle_error",
    "receive",
    "send",
]

_FRAME = b"\x01"  # a frame's first byte; a plain pickle's is PROTO's (0x80)
_FRAME_BYTE = _FRAME[0]
_NAMES: dict[type, str] = {}  # a message class -> its name on the wire
_CLASSES: dict[str, type] = {}  # the reverse, for the classes met in this process


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


def encode(message: Any) -> bytes:
    """``message`` as the wire sends it: a frame for a ``NamedTuple`` (see the module's
    notes), else its plain pickle (:func:`dumps`). Raises what pickling a field raises."""
    kind = type(message)
    name = _NAMES.get(kind)
    if name is None and isinstance(message, tuple) and hasattr(kind, "_fields"):
        name = _frame_name(kind)
    if name is None:
        return pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return _FRAME + pickle.dumps((name, tuple(message)), pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    """The message that :func:`encode` (or :func:`dumps`) made ``data`` of."""
    if not data or data[0] != _FRAME_BYTE:
        return pickle.loads(data)
    name, fields = pickle.loads(data[1:])
    kind = _CLASSES.get(name) or _message_class(name)
    return tuple.__new__(kind, fields)


def _frame_name(kind: type) -> str | None:
    """``kind``'s name on the wire, once it is known to lead back to ``kind`` (as pickle
    checks a class it names); None for a class that cannot be found by its name (one
    made inside a function), which then pickles plainly, failing as pickle fails."""
    name = f"{kind.__module__}:{kind.__qualname__}"
    try:
        found = _message_class(name)
    except Exception:
        return None
    return name if found is kind else None


def _message_class(name: str) -> type:
    """The ``NamedTuple`` class a frame names, imported as pickle would import it."""
    module, _, qualname = name.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, tuple) and hasattr(found, "_fields")):
        raise pickle.UnpicklingError(f"a wire frame names {name}, which is not a message type")
    _NAMES.setdefault(found, name)
    _CLASSES[name] = found
    return found


def send(conn: Connection, message: Any) -> None:
    """Send ``message`` on ``conn``, as :func:`encode` writes it."""
    conn.send_bytes(encode(message))


def receive(conn: Connection) -> Any:
    """The next message on ``conn`` (``EOFError`` once the other end closed)."""
    return decode(conn.recv_bytes())


def pickle_error(obj: Any) -> Exception | None:
    """Why ``obj`` cannot be pickled, or None when it can."""
    try:
        pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return exc
    return None
