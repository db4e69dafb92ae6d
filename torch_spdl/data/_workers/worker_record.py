"""One worker process as the loader's process knows it: its two pipes, its child process,
and the error its unexpected exit becomes.

Apart from :mod:`.process_pool`, which runs the pool, because the record outlives the
process it names: a dead worker's record still answers which batches it held and, with
:func:`died`, how it ended, in torch's words (scripts match them).
"""

from __future__ import annotations

import multiprocessing as mp
import signal

from ..._procwire import Child

__all__ = ["WorkerFailure", "WorkerRecord", "died"]


class WorkerFailure(RuntimeError):
    """A worker process exited unexpectedly, or failed to start."""


class WorkerRecord:
    """Worker ``wid``: the parent's ends of its task and result pipes, the child's ends
    (``child_ends``, closed here once it forked), its :class:`Child` once declared, and
    the error it died with."""

    __slots__ = ("wid", "child", "tasks", "results", "child_ends", "dead")

    def __init__(self, wid: int) -> None:
        self.wid = wid
        self.child: Child = None  # type: ignore[assignment]  # once declared
        task_r, self.tasks = mp.Pipe(duplex=False)
        self.results, result_w = mp.Pipe(duplex=False)
        self.child_ends = (task_r, result_w)
        self.dead: BaseException | None = None


def died(worker: WorkerRecord) -> WorkerFailure:
    """The error for a worker that exited unexpectedly, in torch's words."""
    child = worker.child
    where = f"DataLoader worker (pid {child.pid})"
    sig = child.signal
    if sig is not None:
        what = f"{where} is killed by signal: {signal.strsignal(sig)} ({sig.name})"
    else:
        what = f"{where} exited unexpectedly with exit code {child.exitcode}"
    return WorkerFailure(f"{what}; it was worker process {worker.wid}")
