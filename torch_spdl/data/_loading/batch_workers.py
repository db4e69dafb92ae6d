"""What an epoch asks of the workers that load whole batches: local worker processes
(``_workers/process_pool.py``, the default) or Ray actors (``_ray_actors/ray_workers.py``).

Both keep torch's worker contract (ids, seeds, ``worker_init_fn``, batch ``b`` to worker
``b % num_workers``, each worker's batches in order), so every loading shape that feeds
one feeds the other; this is the one interface those shapes use, written down so that
neither kind of worker reaches into the other.
"""

from __future__ import annotations

from typing import Any, Protocol

from .fetch import Fetched

__all__ = ["BatchWorkers", "Pending"]


class Pending(Protocol):
    """A batch asked for: its result (a ``concurrent.futures.Future``, or a Ray task)."""

    def result(self, timeout: float | None = None) -> Fetched | None: ...


class BatchWorkers(Protocol):
    """``num_workers`` workers loading and collating whole batches."""

    num_workers: int
    #: The worker processes, as torch's iterator shows them (empty for remote ones).
    processes: list[Any]

    def start(self) -> None: ...

    def submit(
        self, b: int, values: Any, split: int | None, indices: list[Any], wid: int | None = None
    ) -> Pending: ...

    def next_batch(self, key: int, wid: int, epoch: int, state: Any) -> Pending: ...

    def result(self, future: Any, timeout: float | None = None) -> Any: ...

    def delivered(self, b: int) -> None: ...

    def no_more_tasks(self) -> None: ...

    def cancel_pending(self, *, for_good: bool = False) -> None: ...

    def shutdown(self) -> None: ...
