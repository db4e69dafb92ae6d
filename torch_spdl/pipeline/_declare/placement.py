"""Where stages run, as declared: ``to(target)`` markers and the regions they make.

``PipelineBuilder.to(ProcessPoolExecutorConfig(...))`` ... ``to(MAIN_PROCESS)`` marks a run
of stages that runs in worker processes; ``to(RayActors(...))`` one that runs in Ray
actors, anywhere in a cluster. This module holds only the declaration side: the targets
(SPDL's executor configs, :class:`RayActors` and ``MAIN_PROCESS``), the ``to()`` marker
(:class:`PlacementConfig`) and :func:`fuse_regions`, which turns each marked run into one
:class:`RegionConfig` at build time. How a region runs is ``_stage_kinds/region.py``'s
job (``_stage_kinds/ray_region.py``'s for Ray); keeping the two apart lets the
declaration be imported (and pickled) without the engine, and without Ray.
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
    "RayActors",
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


class RayActors:
    """Run a region of stages in Ray actors: ``to(RayActors(num_actors=n, ...))``.

    Each actor runs the region's stages as a pipeline of its own on chunks of the
    region's input; the outputs come back in the order the chunks were sent. An actor
    that dies is replaced and its chunks run again; every actor is killed as the pipeline
    stops. Needs Ray (``pip install 'torch_spdl[ray]'``).

    Args:
        num_actors: how many actors.
        address: the cluster to connect to when this process is not connected yet
            (default: Ray's own: ``RAY_ADDRESS``, else a new local instance).
        max_replacements: actors that may be replaced in all before the pipeline fails
            (default: ``2 * num_actors``).
        actor_options: Ray's actor options for every actor (``num_cpus``, default 1;
            ``num_gpus``, ``memory``, ``resources``, ``scheduling_strategy``, ...).
    """

    __slots__ = ("actor_options", "address", "max_replacements", "num_actors")
    num_actors: int
    address: str | None
    max_replacements: int | None
    actor_options: dict[str, Any]

    def __init__(
        self,
        num_actors: int = 1,
        *,
        address: str | None = None,
        max_replacements: int | None = None,
        **actor_options: Any,
    ) -> None:
        _check_count("num_actors", num_actors, 1)
        if max_replacements is not None:
            _check_count("max_replacements", max_replacements, 0)
        if "max_restarts" in actor_options:
            raise ValueError("RayActors replaces dead actors itself: it takes no max_restarts")
        object.__setattr__(self, "num_actors", num_actors)
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "max_replacements", max_replacements)
        object.__setattr__(self, "actor_options", dict(actor_options))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"RayActors is frozen: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RayActors) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # actor_options is a dict

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ray_actors, self._fields())

    def _fields(self) -> tuple[Any, ...]:
        return (self.num_actors, self.address, self.max_replacements, self.actor_options)

    def replacements(self) -> int:
        """The budget of replacements: ``max_replacements``, or ``2 * num_actors``."""
        return 2 * self.num_actors if self.max_replacements is None else self.max_replacements

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.actor_options.items())
        return f"RayActors(num_actors={self.num_actors}{options})"


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def _ray_actors(
    num_actors: int, address: str | None, max_replacements: int | None, options: dict[str, Any]
) -> RayActors:
    return RayActors(num_actors, address=address, max_replacements=max_replacements, **options)


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

    target: ProcessPoolExecutorConfig | RayActors | _MainProcess
    name: str = "placement"

    def __post_init__(self) -> None:
        if not isinstance(self.target, (ProcessPoolExecutorConfig, RayActors, _MainProcess)):
            raise TypeError(
                "to() takes a ProcessPoolExecutorConfig or MAIN_PROCESS (or RayActors), "
                f"got {self.target!r}"
            )

    def label(self) -> str:
        return f"to({self.target!r})"


@dataclass(frozen=True)
class RegionConfig:
    """The stages of one region, fused at build time into one :class:`RegionStage`."""

    stages: tuple[Any, ...]
    executor: ProcessPoolExecutorConfig | RayActors

    def label(self) -> str:
        inner = ", ".join(s.label() for s in self.stages)
        if isinstance(self.executor, RayActors):
            return f"ray_actors[{self.executor.num_actors}]({inner})"
        return f"processes[{self.executor.workers()}]({inner})"


def fuse_regions(stages: Sequence[Any]) -> list[Any]:
    """Replace each ``to(pool)`` ... ``to(MAIN_PROCESS)`` run by one :class:`RegionConfig`
    (a region left open runs to the end); drop the markers."""
    out: list[Any] = []
    region: list[Any] | None = None
    target: ProcessPoolExecutorConfig | RayActors | None = None

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
                "processes or Ray actors: it takes no executor"
            )
        region.append(stage)
    close()
    return out
