"""Staged datasets: a ``__getitem__`` split into stages that each get their own concurrency.

A dataset that subclasses :class:`StagedDataset` defines ``load(index)`` (I/O: reading
files, HTTP; may be ``async def``) and ``process(raw)`` (CPU: decode, transforms). The
DataLoader runs ``load`` with ``io_concurrency`` and ``process`` with ``cpu_concurrency``.
``__getitem__`` still composes the two, so the dataset keeps working with torch's own
DataLoader and with plain indexing. For more than two steps, override :meth:`stages`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch.utils.data import Dataset

__all__ = ["Stage", "StagedDataset"]

StageKind = Literal["io", "cpu"]


@dataclass(frozen=True)
class Stage:
    """One step of a staged ``__getitem__``.

    ``kind`` picks the loader's concurrency knob (``io_concurrency`` or ``cpu_concurrency``)
    unless ``concurrency`` is given. ``executor="process"`` runs a CPU step in worker
    processes (the function and its data must then be picklable).
    """

    fn: Callable[[Any], Any]
    kind: StageKind = "cpu"
    concurrency: int | None = None
    executor: Literal["thread", "process"] = "thread"
    name: str | None = None


class StagedDataset(Dataset):
    """Base class for map-style datasets whose ``__getitem__`` is ``process(load(index))``."""

    def load(self, index: int) -> Any:
        """Fetch the raw data of sample ``index`` (I/O). May be ``async def``."""
        raise NotImplementedError

    def process(self, raw: Any) -> Any:
        """Turn raw data into a sample (CPU work)."""
        return raw

    def stages(self) -> Sequence[Stage]:
        """The steps after the index, in order; default: ``load`` (io) then ``process`` (cpu)."""
        return [Stage(self.load, "io", name="load"), Stage(self.process, "cpu", name="process")]

    def __getitem__(self, index: int) -> Any:
        value: Any = index
        for stage in self.stages():
            value = stage.fn(value)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
        return value


async def _await(value: Any) -> Any:
    return await value
