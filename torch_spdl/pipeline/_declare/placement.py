"""Where stages run, as declared: ``to(target)`` markers and the regions they make.

``PipelineBuilder.to(ProcessPoolExecutorConfig(...))`` ... ``to(MAIN_PROCESS)`` marks a run
of stages that runs in worker processes. This module holds only the declaration side: the
targets (SPDL's executor configs and ``MAIN_PROCESS``), the ``to()`` marker
(:class:`PlacementConfig`) and :func:`fuse_regions`, which turns each marked run into one
:class:`RegionConfig` at build time. How a region runs is ``_stage_kinds/region.py``'s
job; keeping the two apart lets the declaration be imported (and pickled) without the
engine.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._autotune.probes import cpu_count

__all__ = [
    "MAIN_PROCESS",
    "ExecutorConfig",
    "InterpreterPoolExecutorConfig",
    "PlacementConfig",
    "ProcessPoolExecutorConfig",
    "RegionConfig",
    "fuse_regions",
]


@dataclass(frozen=True)
class ExecutorConfig:
    """SPDL's base description of a pool of workers (a ``to()`` target).

    Args:
        max_workers: how many workers (default: the CPUs this process may use).
        initializer: run once in each worker before it builds its pipeline.
        initargs: the initializer's arguments.
    """

    max_workers: int | None = None
    initializer: Callable[..., object] | None = None
    initargs: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.max_workers is not None and (
            isinstance(self.max_workers, bool)
            or not isinstance(self.max_workers, int)
            or self.max_workers < 1
        ):
            raise ValueError(f"max_workers must be a positive int, got {self.max_workers!r}")

    def workers(self) -> int:
        return self.max_workers if self.max_workers is not None else cpu_count()


@dataclass(frozen=True)
class ProcessPoolExecutorConfig(ExecutorConfig):
    """Run a region of stages in worker processes: ``to(ProcessPoolExecutorConfig(...))``.

    Args:
        max_workers: how many worker processes (default: the CPUs this process may use).
        initializer: run once in each worker before it builds its pipeline.
        initargs: the initializer's arguments.
        mp_context: the start method; default ``fork`` where there is one (the region's
            ops need not pickle), else ``spawn`` (they must).
    """

    mp_context: str | None = None

    def context(self) -> Any:
        method = self.mp_context
        if method is None:
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        return mp.get_context(method)


@dataclass(frozen=True)
class InterpreterPoolExecutorConfig(ExecutorConfig):
    """SPDL's subinterpreter target: not available (it needs Python 3.14)."""

    def __post_init__(self) -> None:
        raise RuntimeError(
            "InterpreterPoolExecutorConfig needs subinterpreters (Python 3.14), which "
            "torch_spdl does not use; use ProcessPoolExecutorConfig"
        )


class _MainProcess:
    """The ``to()`` target that ends a region (use :data:`MAIN_PROCESS`)."""

    _instance: _MainProcess | None = None

    def __new__(cls) -> _MainProcess:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MAIN_PROCESS"

    def __reduce__(self) -> str:
        return "MAIN_PROCESS"


MAIN_PROCESS = _MainProcess()


@dataclass(frozen=True)
class PlacementConfig:
    """A ``to(target)`` marker among the stages: the stages after it run on ``target``."""

    target: ProcessPoolExecutorConfig | _MainProcess
    name: str = "placement"

    def __post_init__(self) -> None:
        if not isinstance(self.target, (ProcessPoolExecutorConfig, _MainProcess)):
            raise TypeError(
                f"to() takes a ProcessPoolExecutorConfig or MAIN_PROCESS, got {self.target!r}"
            )

    def label(self) -> str:
        return f"to({self.target!r})"


@dataclass(frozen=True)
class RegionConfig:
    """The stages of one region, fused at build time into one :class:`RegionStage`."""

    stages: tuple[Any, ...]
    executor: ProcessPoolExecutorConfig

    def label(self) -> str:
        inner = ", ".join(s.label() for s in self.stages)
        return f"processes[{self.executor.workers()}]({inner})"


def fuse_regions(stages: Sequence[Any]) -> list[Any]:
    """Replace each ``to(pool)`` ... ``to(MAIN_PROCESS)`` run by one :class:`RegionConfig`
    (a region left open runs to the end); drop the markers."""
    out: list[Any] = []
    region: list[Any] | None = None
    target: ProcessPoolExecutorConfig | None = None

    def close() -> None:
        if region is not None:
            if not region:
                raise ValueError(f"to({target!r}) is followed by no stage before the next to()")
            assert target is not None
            out.append(RegionConfig(tuple(region), target))

    for stage in stages:
        if isinstance(stage, PlacementConfig):
            close()
            if isinstance(stage.target, _MainProcess):
                region, target = None, None
            else:
                region, target = [], stage.target
            continue
        if region is None:
            out.append(stage)
            continue
        if getattr(stage, "executor", None) is not None:
            raise ValueError(
                f"stage {stage.label()!r} is in a to() region, which runs in worker "
                "processes: it takes no executor"
            )
        region.append(stage)
    close()
    return out
