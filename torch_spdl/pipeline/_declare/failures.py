"""How many failed items a pipeline tolerates: a count, or a rate after a probation.

``max_failures`` is SPDL's knob: an ``int`` is a count (-1: no limit) and a
``fractions.Fraction`` in (0, 1] is a rate, failures / invocations. A rate over a handful
of items says nothing (one failure in the first three items is 33%), so it is checked only
once the stages it covers have run :func:`probation` invocations. Given to ``build`` the
limit counts failures across every stage that does not set its own; given to ``pipe`` it
counts that stage's alone. Each limit is a :class:`FailureLimit` shared by the stages it
covers; it is touched only when an item fails (and once when a stage ends), never on the
per-item path.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from fractions import Fraction

__all__ = ["FailureLimit", "MaxFailures", "check_max_failures", "probation"]

MaxFailures = int | Fraction

MIN_PROBATION = 100


def check_max_failures(value: object, where: str) -> MaxFailures:
    """Validate a ``max_failures`` value; raise ``ValueError``/``TypeError`` naming ``where``."""
    if isinstance(value, Fraction):
        if not 0 < value <= 1:
            raise ValueError(
                f"{where}: max_failures={value} is a failure rate and must be in range (0, 1], "
                "e.g. Fraction(1, 10) for 10%"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{where}: max_failures must be an int (a count, -1 for no limit) or a "
            f"fractions.Fraction (a rate), got {value!r}"
        )
    return value


def probation(rate: Fraction) -> int:
    """Invocations before a rate is checked: at least 100, and enough that a single
    failure cannot exceed the rate on its own."""
    return max(MIN_PROBATION, math.ceil(1 / rate))


class FailureLimit:
    """One ``max_failures`` limit and the failures counted against it.

    ``invocations`` returns how many items the covered stages have taken so far (read
    only when an item fails, so the workers keep their lock-free counters).
    """

    def __init__(self, limit: MaxFailures, invocations: Callable[[], int]) -> None:
        self.limit = limit
        self._invocations = invocations
        self._lock = threading.Lock()
        self.count = 0

    @property
    def is_rate(self) -> bool:
        return isinstance(self.limit, Fraction)

    def describe(self) -> str:
        if isinstance(self.limit, Fraction):
            after = probation(self.limit)
            return f"max_failures={self.limit} (a rate, checked after {after} items)"
        return f"max_failures={self.limit}"

    def invocations(self) -> int:
        """Items the covered stages have taken so far."""
        return self._invocations()

    def add(self) -> bool:
        """Count one failure; True when the limit is now exceeded."""
        with self._lock:
            self.count += 1
            count = self.count
        return self.exceeded(count)

    def exceeded(self, count: int | None = None) -> bool:
        """True when ``count`` (default: the failures so far) exceeds the limit."""
        if count is None:
            count = self.count
        limit = self.limit
        if isinstance(limit, Fraction):
            if not count:
                return False
            invocations = self._invocations()
            return invocations >= probation(limit) and Fraction(count, invocations) > limit
        return 0 <= limit < count
