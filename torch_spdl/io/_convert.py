"""Copying decoded frames into one contiguous NumPy buffer (one copy per frame)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import av
import numpy as np

from ._buffers import BufferPool
from ._frames import AudioFrames, Frames

_LG = logging.getLogger(__name__)

_CHANNELS = {"rgb24": 3, "bgr24": 3, "rgba": 4, "bgra": 4, "argb": 4, "abgr": 4, "gray": 1}


def _packed(frame: Any) -> Any:
    if frame.format.name in _CHANNELS:
        return frame
    _LG.debug("converting %s frame to rgb24 for batching", frame.format.name)
    return frame.reformat(format="rgb24", threads=1)


def _copy_image(frame: Any, out: np.ndarray) -> None:
    """Copy a packed frame's pixels into ``out`` (H, W, C), skipping the row padding."""
    h, w, c = out.shape
    plane = frame.planes[0]
    rows = np.frombuffer(plane, dtype=np.uint8, count=plane.line_size * h)
    out[...] = rows.reshape(h, plane.line_size)[:, : w * c].reshape(h, w, c)


def _convert_images(frames: list[Any], pool: BufferPool | None) -> np.ndarray:
    frames = [_packed(f) for f in frames]
    first = frames[0]
    shape = (first.height, first.width, _CHANNELS[first.format.name])
    for f in frames:
        if (
            f.height,
            f.width,
            _CHANNELS[f.format.name],
        ) != shape or f.format.name != first.format.name:
            raise ValueError(
                f"frames differ in size or format: {f.width}x{f.height} {f.format.name} vs "
                f"{first.width}x{first.height} {first.format.name}; resize them to one size"
            )
    out = pool.take((len(frames), *shape), np.uint8) if pool is not None else None
    if out is None:
        out = np.empty((len(frames), *shape), dtype=np.uint8)
    for i, f in enumerate(frames):
        _copy_image(f, out[i])
    return out


def _convert_audio(frames: list[Any]) -> np.ndarray:
    if any(f.format.name not in ("flt", "fltp") for f in frames):
        resampler = av.AudioResampler(format="flt")
        frames = [g for f in frames for g in resampler.resample(f)]
    channels = len(frames[0].layout.channels)
    out = np.empty((sum(f.samples for f in frames), channels), dtype=np.float32)
    pos = 0
    for f in frames:
        n = f.samples
        if f.format.is_planar:
            for c in range(channels):
                out[pos : pos + n, c] = np.frombuffer(f.planes[c], np.float32, count=n)
        else:
            out[pos : pos + n] = np.frombuffer(f.planes[0], np.float32, count=n * channels).reshape(
                n, channels
            )
        pos += n
    return out


def convert_frames(
    frames: Frames | Sequence[Frames], *, pool: BufferPool | None = None
) -> np.ndarray:
    """Copy frames into ONE contiguous buffer.

    - a sequence of :class:`ImageFrames` (a batch, all the same size) or one
      :class:`VideoFrames`: ``uint8`` array ``(N, H, W, C)`` (``C`` = 3 for ``rgb24``, 1
      for ``gray``, 4 for ``rgba``; other formats are converted to ``rgb24``);
    - :class:`AudioFrames`: ``float32`` array ``(num_samples, num_channels)``.

    Each frame is copied once, straight from FFmpeg's planes into its slice. With a
    :class:`BufferPool`, image batches land in a reused buffer (free again once every
    array and tensor made from it is gone) instead of fresh memory.
    """
    if isinstance(frames, AudioFrames):
        return _convert_audio(frames.frames)
    if isinstance(frames, Frames):
        items = frames.frames
    else:
        items = [f for fr in frames for f in fr.frames]
    if not items:
        raise ValueError("no frames to convert")
    return _convert_images(items, pool)


def to_torch(buffer: Any) -> Any:
    """View ``buffer`` (a NumPy array, or anything with the array interface) as a
    ``torch.Tensor`` without copying. Tensors are returned as they are."""
    import torch

    if isinstance(buffer, torch.Tensor):
        return buffer
    if hasattr(buffer, "__cuda_array_interface__"):
        return torch.as_tensor(buffer, device="cuda")
    return torch.from_numpy(np.asarray(buffer))
