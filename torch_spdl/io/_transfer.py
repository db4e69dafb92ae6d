"""Moving tensors to the GPU on a dedicated per-thread CUDA stream."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

_LG = logging.getLogger(__name__)
_LOCAL = threading.local()
T = TypeVar("T")


@dataclass(frozen=True)
class CUDAConfig:
    """Where :func:`transfer_tensor` copies to."""

    device_index: int = 0


def cuda_config(device_index: int = 0) -> CUDAConfig:
    """Return a :class:`CUDAConfig` for ``cuda:device_index``."""
    return CUDAConfig(device_index)


def _stream(torch: Any, device: Any) -> Any:
    streams = getattr(_LOCAL, "streams", None)
    if streams is None:
        streams = _LOCAL.streams = {}
    if device not in streams:
        streams[device] = torch.cuda.Stream(device=device)
        _LG.debug("created transfer stream on %s for thread %s", device, threading.get_ident())
    return streams[device]


def _move(torch: Any, data: Any, device: Any) -> Any:
    if isinstance(data, torch.Tensor):
        src = data if data.is_pinned() else data.pin_memory()
        return src.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {k: _move(torch, v, device) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_move(torch, v, device) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_move(torch, v, device) for v in data)
    return data


def transfer_tensor(data: T, device: Any = None) -> T:
    """Copy the tensors in ``data`` (a tensor, or dicts/lists/tuples of them) to the GPU.

    Memory is pinned, and the copy runs on a CUDA stream dedicated to the calling thread;
    the call waits for that stream only, so the default stream (the model) never waits.
    Without CUDA, ``data`` is returned unchanged (tensors stay on the CPU).
    """
    import torch

    if not torch.cuda.is_available():
        return data
    if isinstance(device, CUDAConfig):
        device = device.device_index
    if device is None or isinstance(device, int):
        index = torch.cuda.current_device() if device is None else device
        dev = torch.device("cuda", index)
    else:
        dev = torch.device(device)
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    stream = _stream(torch, dev)
    with torch.cuda.stream(stream):
        out = _move(torch, data, dev)
    stream.synchronize()
    return out
