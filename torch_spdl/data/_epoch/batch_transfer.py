"""The DataLoader's transfer stage: pin a batch, or copy it to the GPU with
:func:`torch_spdl.io.transfer_tensor` (a per-thread side stream)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from ...io import transfer_tensor

__all__ = ["BatchMover"]


class BatchMover:
    """Callable that pins a batch and/or copies it to ``device``; ``active`` is False when
    there is nothing to do (no CUDA), and then the loader adds no stage at all."""

    def __init__(self, device: str | torch.device | None, *, pin_memory: bool) -> None:
        self.device = torch.device(device) if device is not None else None
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.to_cuda = (
            self.device is not None and self.device.type == "cuda" and torch.cuda.is_available()
        )
        self.active = self.pin_memory or self.to_cuda

    def __call__(self, batch: Any) -> Any:
        if self.to_cuda:
            return transfer_tensor(batch, self.device)
        if self.pin_memory:
            return tree_map(_pin, batch)
        return batch


def _pin(x: Any) -> Any:
    return x.pin_memory() if isinstance(x, torch.Tensor) and not x.is_pinned() else x
