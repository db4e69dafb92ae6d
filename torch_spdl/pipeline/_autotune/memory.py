"""What autotuning learnt, kept for the next build of the same declaration in this process.

Every ``pipe(..., concurrency="auto")`` call gets a stage id (:func:`new_stage_id`, stored
in ``PipeConfig.tune_key``): an integer unique in the process, assigned when the stage is
declared, not derived from its display name (two stages may share a name, and a name may
change with its position). A builder built again holds the same declarations, so the same
ids: each build starts its autotuned stages where the previous build's tuner last held them
(:func:`recall`), instead of from 1. The table is bounded (least recently written entries
go first), holds plain ints, and is never shared with another process.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["forget_all", "new_stage_id", "recall", "remember"]

MAX_ENTRIES = 4096

_ids = itertools.count(1)
_lock = threading.Lock()
_learnt: OrderedDict[Hashable, int] = OrderedDict()


def new_stage_id() -> int:
    """A process-unique id for a newly declared stage."""
    return next(_ids)


def remember(key: Hashable | None, concurrency: int) -> None:
    """Record the concurrency the tuner holds for stage ``key`` (None: not kept)."""
    if key is None:
        return
    with _lock:
        _learnt[key] = concurrency
        _learnt.move_to_end(key)
        while len(_learnt) > MAX_ENTRIES:
            _learnt.popitem(last=False)


def recall(key: Hashable | None) -> int | None:
    """The concurrency last held for stage ``key``, if any."""
    if key is None:
        return None
    with _lock:
        return _learnt.get(key)


def forget_all() -> None:
    """Drop everything learnt (for tests and benchmarks that need a cold start)."""
    with _lock:
        _learnt.clear()
