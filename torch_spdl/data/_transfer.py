"""Move batches to a device on a dedicated stage: pin, copy on a side stream, wait."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._pytree import tree_map

__all__ = ["BatchMover"]

_LOCAL = threading.local()


def _stream(device: torch.device) -> Any:
    streams = getattr(_LOCAL, "streams", None)
    if streams is None:
        streams = _LOCAL.streams = {}
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]


class BatchMover:
    """Callable that pins a batch and/or copies it to ``device`` (a no-op without CUDA).

    The copy runs on a per-thread CUDA stream and waits only on that stream, so the
    training loop's default stream is not blocked.
    """

    def __init__(self, device: str | torch.device | None, pin_memory: bool) -> None:
        self.device = torch.device(device) if device is not None else None
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.active = self.pin_memory or (
            self.device is not None and self.device.type == "cuda" and torch.cuda.is_available()
        )

    def __call__(self, batch: Any) -> Any:
        if not self.active:
            return batch
        device = self.device
        if device is None or device.type != "cuda":
            return tree_map(_pin, batch)
        stream = _stream(device)
        with torch.cuda.stream(stream):
            moved = tree_map(lambda t: _to(_pin(t), device), batch)
        stream.synchronize()
        return moved


def _pin(x: Any) -> Any:
    return x.pin_memory() if isinstance(x, torch.Tensor) and not x.is_pinned() else x


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x
