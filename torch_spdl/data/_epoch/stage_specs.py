"""The stages an epoch declares: per-sample steps, their concurrency, and ``"auto"`` ids.

A map-style epoch runs ``__getitem__`` (or a :class:`StagedDataset`'s stages) one sample
at a time: :func:`stage_specs` says with what concurrency and on which threads each step
runs, :func:`split_point` which steps go to worker processes instead. A stage declared
with ``"auto"`` concurrency gets an id (its stage name: ``"collate"``, ``"load"``, ...)
from :class:`AutoStages`, which starts it where it settled the epoch before and records
where it settles now, under that id.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ...pipeline import StageStats
from .._loading.sample_ops import stage_op
from .._loading.staged_dataset import Stage, StagedDataset, StageKind
from .._loading.worker_info import WorkerGroup
from .epoch_plan import Concurrency, EpochPlan, LoaderResources
from .thread_or_process import usable_cores

__all__ = ["AutoStages", "StageSpec", "bound", "split_point", "stage_fns", "stage_specs"]


# The most workers an autotuned I/O stage may grow to (the engine's own bound for a thread
# stage; docs/dataloader.md gives it): its workers mostly wait.
_MOST_IO_WORKERS = 64


@dataclass(frozen=True)
class StageSpec:
    """One per-sample step, as the epoch declares it."""

    op: Any
    concurrency: Concurrency
    executor: Executor | None
    name: str  # also the id its tuned concurrency is kept under
    kind: StageKind  # what bounds an autotuned stage
    floor: int | None = None  # the least an autotuned stage runs (the old fixed default)


def bound(concurrency: Concurrency, kind: StageKind) -> int:
    """A stage's concurrency, or for ``"auto"`` the most it may grow to: I/O stages wait,
    so they may have many workers; CPU stages gain nothing beyond the cores."""
    if concurrency != "auto":
        return int(concurrency)
    return _MOST_IO_WORKERS if kind == "io" else usable_cores()


def stage_specs(
    plan: EpochPlan, threads: int | None, pool: Executor | None, group: WorkerGroup | None
) -> list[StageSpec]:
    """The per-sample stages, all on threads (``threads`` runs a plain ``__getitem__``;
    ``pool`` and ``group``: the threads of sync steps and their worker ids)."""
    dataset = plan.dataset
    workers = plan.threads
    if isinstance(dataset, StagedDataset):
        steps = list(dataset.stages())
    else:
        steps = [Stage(dataset.__getitem__, "cpu", name="getitem")]
    specs = []
    for step in steps:
        name: str = step.name or getattr(step.fn, "__name__", None) or "stage"
        conc: Concurrency
        floor = None
        if step.concurrency is not None:
            conc = step.concurrency
        elif step.kind == "io":
            # By default an I/O stage is autotuned, never below the fixed default it had
            # before (docs/autotune.md, "On by default").
            conc = plan.io_concurrency or "auto"
            floor = None if plan.io_concurrency else max(workers, 8)
        else:
            conc = plan.cpu_concurrency or threads or workers
        is_async = inspect.iscoroutinefunction(step.fn)
        op = stage_op(step.fn, name, None if is_async else group)
        specs.append(StageSpec(op, conc, None if is_async else pool, name, step.kind, floor))
    return specs


def split_point(dataset: Any, worker_type: str, num_workers: int) -> int | None:
    """The first of a staged dataset's stages to run in worker processes (with every stage
    after it), or None when all run on threads (always without workers): the first
    declared with ``executor="process"``, or with ``worker_type="process"`` (the default)
    the first sync CPU stage."""
    if num_workers == 0:
        return None
    steps = list(dataset.stages())
    for i, step in enumerate(steps):
        if step.executor == "process" or (
            worker_type == "process"
            and step.kind == "cpu"
            and not inspect.iscoroutinefunction(step.fn)
        ):
            return i
    return None


def stage_fns(dataset: Any, split: int) -> list[Any]:
    """In a worker process: the functions of the dataset's stages from ``split`` on."""
    return [step.fn for step in list(dataset.stages())[split:]]


class AutoStages:
    """The ``"auto"`` stages of one pipeline declaration, by the ids the epoch gave them
    (a fresh one for each declaration)."""

    def __init__(self, resources: LoaderResources) -> None:
        self._resources = resources
        self._ids: list[str] = []  # in declaration order

    def declare(
        self,
        stage_id: str,
        concurrency: Concurrency,
        kind: StageKind,
        floor: int | None = None,
    ) -> dict[str, Any]:
        """``pipe`` keywords for the stage ``stage_id``: its name, and for an ``"auto"``
        one its bound, its ``floor`` (never below it) and where it ended the epoch before
        (when known)."""
        kw: dict[str, Any] = {"name": stage_id}
        if concurrency != "auto":
            return kw
        self._ids.append(stage_id)
        most = max(bound("auto", kind), floor or 1)
        kw["max_concurrency"] = most
        start = self._resources.tuned(stage_id)
        if start is not None:
            kw["initial_concurrency"] = max(1, min(start, most))
        if floor is not None:
            kw["min_concurrency"] = floor
            kw.setdefault("initial_concurrency", floor)
        return kw

    def record(self, stats: Sequence[StageStats]) -> None:
        """Keep where the pipeline's ``"auto"`` stages settled: its autotuned stages, in
        pipeline order, are the ones declared with ``"auto"``, in the same order."""
        tuned = [s for s in stats if s.max_concurrency is not None]
        if len(tuned) != len(self._ids):
            return  # not the declared pipeline (the stand-in between two)
        for stage_id, s in zip(self._ids, tuned, strict=True):
            self._resources.record_tuned(stage_id, s.concurrency)
