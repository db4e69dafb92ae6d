"""Per-stage counters, their snapshot, and the periodic reporter."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Counters", "StageStats", "format_stats", "StatsReporter"]

_LG = logging.getLogger("torch_spdl.pipeline")


class Counters:
    """Counts kept by one worker; only that worker writes them, so no lock is needed."""

    __slots__ = ("num_in", "num_out", "op_time")

    def __init__(self) -> None:
        self.num_in = 0
        self.num_out = 0
        self.op_time = 0.0


@dataclass(frozen=True)
class StageStats:
    """A snapshot of one stage.

    ``op_time`` is the time spent inside the op summed over workers; ``queue_depth`` is
    the mean number of items waiting in the stage's input queue each time it took one.
    ``max_concurrency`` is set for a stage with ``concurrency="auto"``: ``concurrency`` is
    then the value the autotuner chose last, between 1 and ``max_concurrency``.
    """

    name: str
    concurrency: int
    num_in: int
    num_out: int
    num_failed: int
    op_time: float
    queue_depth: float
    queue_capacity: int
    elapsed: float
    max_concurrency: int | None = None

    @property
    def autotuned(self) -> bool:
        """True for a stage declared with ``concurrency="auto"``."""
        return self.max_concurrency is not None

    @property
    def throughput(self) -> float:
        """Items out per second since the pipeline started."""
        return self.num_out / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def mean_op_time(self) -> float:
        """Mean seconds inside the op per input item."""
        return self.op_time / self.num_in if self.num_in else 0.0


def format_stats(stats: Sequence[StageStats]) -> str:
    """A fixed-width table of stage snapshots, one line per stage."""
    head = (
        f"{'stage':<28} {'conc':>7} {'in':>9} {'out':>9} {'failed':>6} "
        f"{'items/s':>10} {'ms/item':>8} {'queue':>11}"
    )
    lines = [head, "-" * len(head)]
    for s in stats:
        queue = f"{s.queue_depth:.1f}/{s.queue_capacity or 'inf'}"
        conc = f"auto:{s.concurrency}" if s.autotuned else str(s.concurrency)
        lines.append(
            f"{s.name[:28]:<28} {conc:>7} {s.num_in:>9} {s.num_out:>9} "
            f"{s.num_failed:>6} {s.throughput:>10.1f} {s.mean_op_time * 1e3:>8.3f} {queue:>11}"
        )
    return "\n".join(lines)


class StatsReporter:
    """Logs the stage table every ``interval`` seconds on a thread the pipeline owns."""

    def __init__(self, interval: float, snapshot: Callable[[], Sequence[StageStats]]) -> None:
        self._interval = interval
        self._snapshot = snapshot
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="torch_spdl-stats", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            table = format_stats(self._snapshot())
            _LG.info("pipeline stats at %s\n%s", time.strftime("%X"), table)

    def stop(self) -> None:
        self._stop.set()
