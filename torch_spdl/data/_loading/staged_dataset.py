"""Staged datasets: a ``__getitem__`` split into stages that each get their own concurrency.

A dataset that subclasses :class:`StagedDataset` defines ``load(index)`` (I/O: reading
files, HTTP; may be ``async def``) and ``process(raw)`` (CPU: decode, transforms). The
DataLoader runs ``load`` with ``io_concurrency`` and ``process`` with ``cpu_concurrency``.
``__getitem__`` still composes the two, so the dataset keeps working with torch's own
DataLoader and with plain indexing. For more than two steps, override :meth:`stages`.

A subclass that overrides ``__getitem__`` below the class defining the stages (say, of a
dataset split by ``torch-spdl migrate``) is run as one CPU stage calling its
``__getitem__``: otherwise the loader would run the base's stages and skip the override.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch.utils.data import Dataset

__all__ = ["Stage", "StagedDataset"]

_LG = logging.getLogger(__name__)
_STAGE_METHODS = ("load", "process", "stages")
_warned: weakref.WeakSet[type] = weakref.WeakSet()  # warned once each
_composing = threading.local()  # inside StagedDataset.__getitem__: no fallback (recursion)

StageKind = Literal["io", "cpu"]


@dataclass(frozen=True)
class Stage:
    """One step of a staged ``__getitem__``.

    ``kind`` picks the loader's concurrency knob (``io_concurrency`` or ``cpu_concurrency``)
    unless ``concurrency`` is given. ``executor="process"`` runs a CPU step in worker
    processes (the function and its data must then be picklable).

    Args:
        fn: the step: takes the previous step's output (the first, the index) and returns
            this step's; may be ``async def``.
        kind: ``"io"`` (waits: reading, fetching) or ``"cpu"`` (computes).
        concurrency: this step's workers, overriding the loader's knob for its kind.
        executor: ``"thread"`` (default) or ``"process"`` (this step and every one after
            it run in worker processes).
        name: the stage's name in errors, stats and traces (default: ``fn``'s name).
    """

    fn: Callable[[Any], Any]
    kind: StageKind = "cpu"
    concurrency: int | None = None
    executor: Literal["thread", "process"] = "thread"
    name: str | None = None


class StagedDataset(Dataset):
    """Base class for map-style datasets whose ``__getitem__`` is ``process(load(index))``.

    Subclasses define :meth:`load` and :meth:`process`, or :meth:`stages` for more steps,
    and ``__len__``; the constructor is the subclass's own (this class takes no
    arguments). :class:`~torch_spdl.DataLoader` runs each stage with its own concurrency
    (``io_concurrency``, ``cpu_concurrency``, or the stage's ``concurrency``); indexing
    and torch's DataLoader run them one after the other.
    """

    def load(self, index: int) -> Any:
        """Fetch the raw data of sample ``index`` (I/O). May be ``async def``."""
        raise NotImplementedError

    def process(self, raw: Any) -> Any:
        """Turn raw data into a sample (CPU work)."""
        return raw

    def stages(self) -> Sequence[Stage]:
        """The steps after the index, in order; default: ``load`` (io) then ``process`` (cpu),
        or one CPU stage calling ``__getitem__`` when a subclass overrides it below the
        class that defines ``load``/``process``/``stages`` (see the module's docstring)."""
        if not getattr(_composing, "active", False) and _getitem_overrides_stages(type(self)):
            return [Stage(self.__getitem__, "cpu", name="getitem")]
        return [Stage(self.load, "io", name="load"), Stage(self.process, "cpu", name="process")]

    def __getitem__(self, index: int) -> Any:
        outer = getattr(_composing, "active", False)
        _composing.active = True
        try:
            steps = self.stages()
        finally:
            _composing.active = outer
        value: Any = index
        for stage in steps:
            value = stage.fn(value)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
        return value


async def _await(value: Any) -> Any:
    return await value


def _getitem_overrides_stages(cls: type) -> bool:
    """Whether the ``__getitem__`` that ``cls`` uses comes from a class more derived than
    every class defining ``load``, ``process`` or ``stages``: the stages would bypass it.
    A class defining ``__getitem__`` together with a stage method is trusted to agree."""
    mro = cls.__mro__

    def owner(name: str) -> int:
        return next((i for i, c in enumerate(mro) if name in c.__dict__), len(mro))

    getitem = owner("__getitem__")
    if getitem >= min(owner(m) for m in _STAGE_METHODS):
        return False
    if cls not in _warned:
        _warned.add(cls)
        _LG.warning(
            "%s overrides __getitem__ (in %s) below the class defining its load/process "
            "stages: torch_spdl runs its __getitem__ as one cpu stage; define load/process "
            "(or stages) next to that __getitem__ to run them as stages",
            cls.__qualname__,
            mro[getitem].__qualname__,
        )
    return True
