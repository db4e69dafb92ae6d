"""Async variants: the same work on a thread (``asyncio.to_thread``), so an event loop
(a pipeline's async stage) is never blocked. Decoding releases the GIL."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._convert import convert_frames, to_torch
from ._decode import decode_packets
from ._demux import Packets, demux_audio, demux_image, demux_video
from ._frames import Frames
from ._input import Source
from ._load import load_image_batch
from ._sample import sample_decode_video
from ._transfer import CUDAConfig, transfer_tensor


async def async_demux_image(src: Source, **kwargs: Any) -> Packets:
    """:func:`demux_image` on a thread."""
    return await asyncio.to_thread(demux_image, src, **kwargs)


async def async_demux_video(src: Source, **kwargs: Any) -> Packets:
    """:func:`demux_video` on a thread."""
    return await asyncio.to_thread(demux_video, src, **kwargs)


async def async_demux_audio(src: Source, **kwargs: Any) -> Packets:
    """:func:`demux_audio` on a thread."""
    return await asyncio.to_thread(demux_audio, src, **kwargs)


async def async_decode_packets(packets: Packets, **kwargs: Any) -> Frames:
    """:func:`decode_packets` on a thread."""
    return await asyncio.to_thread(decode_packets, packets, **kwargs)


async def async_sample_decode_video(packets: Packets, *args: Any, **kwargs: Any) -> list[Any]:
    """:func:`sample_decode_video` on a thread."""
    return await asyncio.to_thread(sample_decode_video, packets, *args, **kwargs)


async def async_convert_frames(frames: Frames | Sequence[Frames], **kwargs: Any) -> np.ndarray:
    """:func:`convert_frames` on a thread."""
    return await asyncio.to_thread(convert_frames, frames, **kwargs)


async def async_transfer_tensor(data: Any, device: Any = None) -> Any:
    """:func:`transfer_tensor` on a thread."""
    return await asyncio.to_thread(transfer_tensor, data, device)


async def async_load_image_batch(
    srcs: Sequence[Source], *, cuda_config: CUDAConfig | None = None, **kwargs: Any
) -> Any:
    """:func:`load_image_batch` (same keywords) on a thread; with ``cuda_config`` the batch
    (as a tensor) is then sent to that GPU with :func:`transfer_tensor` (a no-op without
    CUDA)."""

    def run() -> Any:
        buf = load_image_batch(srcs, **kwargs)
        if cuda_config is None:
            return buf
        return transfer_tensor(to_torch(buf), cuda_config)

    return await asyncio.to_thread(run)
