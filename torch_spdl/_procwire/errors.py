"""Errors that cross a process boundary: the exception itself when it survives pickling,
else its type and message, always with its traceback text and its cause.

Pickling an exception keeps its type, arguments and notes, but drops its traceback and its
``__cause__``; some exceptions do not pickle at all (one holding a lock), and some pickle
but cannot be rebuilt (a constructor with required keywords). :class:`PortableError` is
made in the child (:meth:`PortableError.of`, which tries the round trip there, where a
failure can still be reported) and turned back into an exception in the parent
(:meth:`PortableError.rebuild`): the original one when it survived, else ``fallback`` with
its type and message, the child's traceback as a note either way, and the cause rebuilt
the same way. Every process boundary of torch_spdl sends its errors as one of these.
"""

from __future__ import annotations

import pickle
import traceback
from typing import NamedTuple

__all__ = ["PortableError"]

_MAX_CAUSES = 8  # a chain of causes longer than this is cut (the text still has it all)


class PortableError(NamedTuple):
    """An exception made to cross a process boundary (see the module notes)."""

    pickled: bytes | None  # the exception, when it survives a pickle round trip
    type_name: str  # its module and qualified name
    message: str  # str(exc)
    text: str  # its traceback, causes included, as the child printed it
    cause: PortableError | None

    @classmethod
    def of(cls, exc: BaseException, depth: int = 0) -> PortableError:
        """``exc`` made portable (in the child)."""
        text = "".join(traceback.format_exception(exc))
        pickled: bytes | None
        try:
            pickled = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
            pickle.loads(pickled)
        except Exception:
            pickled = None
        kind = type(exc)
        cause = exc.__cause__
        return cls(
            pickled,
            f"{kind.__module__}.{kind.__qualname__}",
            str(exc),
            text,
            cls.of(cause, depth + 1) if cause is not None and depth < _MAX_CAUSES else None,
        )

    def rebuild(self, where: str, fallback: type[BaseException] = RuntimeError) -> BaseException:
        """The exception again (in the parent), noted with its traceback in ``where``."""
        exc: BaseException | None = None
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:  # it loaded in the child, not here (a module missing here)
                exc = None
        if exc is None:
            exc = fallback(f"{self.type_name}: {self.message}")
        exc.add_note(f"traceback in the {where}:\n{self.text}")
        if self.cause is not None:
            exc.__cause__ = self.cause.rebuild(where, fallback)
        return exc
