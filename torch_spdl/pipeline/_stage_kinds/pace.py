"""How many items a worker takes at once: about :data:`TAKE_S` of its op's work.

A bulk take (``Channel.get_many``) saves a lock and, more often, a thread switch per
item, but the items taken wait for the ones before them in the same worker. So each
worker measures its op's time per item (a moving average) and takes about
:data:`TAKE_S` of work at a time, at most :data:`MAX_TAKE` items: the first take is one
item, an op slower than half of :data:`TAKE_S` takes one at a time as before, and a
stage of slow or GIL-releasing ops keeps every worker busy (64 threads sleeping 10 ms
still hold 64 items). A source paces the items it stages between flushes the same way,
by the time its iterator takes per item.
"""

from __future__ import annotations

__all__ = ["MAX_TAKE", "TAKE_S", "Pace"]

TAKE_S = 100e-6  # the work a take holds: small beside any op worth a stage of threads
MAX_TAKE = 256


class Pace:
    """One worker's take limit, from the seconds per item it has measured so far."""

    __slots__ = ("limit", "_per_item")

    def __init__(self) -> None:
        self.limit = 1
        self._per_item = 0.0

    def update(self, seconds: float, items: int) -> None:
        """``items`` took ``seconds``: move the average and the next take's limit."""
        if items <= 0:
            return
        now = seconds / items
        avg = self._per_item = now if not self._per_item else 0.7 * self._per_item + 0.3 * now
        self.limit = max(1, min(MAX_TAKE, int(TAKE_S / avg))) if avg > 0 else MAX_TAKE
