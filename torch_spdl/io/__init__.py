"""torch_spdl.io: media decoding on PyAV (FFmpeg), batching into one buffer, GPU transfer.

Two layers, the names of SPDL's ``spdl.io``:

- building blocks: :func:`demux_image` / :func:`demux_video` / :func:`demux_audio` ->
  :func:`decode_packets` (with a :func:`get_video_filter_desc` chain run inside FFmpeg), or
  :func:`sample_decode_video` for some frames of a video ->
  :func:`convert_frames` (one contiguous NumPy buffer, reused from a :class:`BufferPool`
  if given) -> :func:`to_torch` (a view) ->
  :func:`transfer_tensor` (pinned memory, dedicated CUDA stream);
- one call: :func:`load_image`, :func:`load_image_batch`, :func:`load_video`
  (whole, a window, or sampled frames by index or time), :func:`load_video_clip` (a random
  clip for training), :func:`load_audio`.

Every input that cannot be read raises :class:`MediaError`, naming the source; so does an
image or video frame that declares more pixels than ``max_pixels`` (default
:data:`DEFAULT_MAX_PIXELS`, PIL's limit), before it is decoded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._buffers import BufferPool
from ._errors import MediaError
from ._filter_desc import get_audio_filter_desc, get_video_filter_desc
from ._limits import DEFAULT_MAX_PIXELS
from ._transfer import CUDAConfig, cuda_config, transfer_tensor

# The names that need PyAV are imported on first use: importing PyAV takes about 50 ms,
# and ``torch_spdl.DataLoader`` (which uses BufferPool and transfer_tensor) is imported by
# training scripts that decode no media with us.
_LAZY = {
    "_async": (
        "async_convert_frames",
        "async_decode_packets",
        "async_demux_audio",
        "async_demux_image",
        "async_demux_video",
        "async_load_image_batch",
        "async_sample_decode_video",
        "async_transfer_tensor",
    ),
    "_convert": ("convert_frames", "to_torch"),
    "_decode": ("decode_packets", "pick_lowres"),
    "_demux": ("Packets", "demux_audio", "demux_image", "demux_video"),
    "_frames": ("AudioFrames", "Frames", "ImageFrames", "VideoFrames"),
    "_input": ("Source",),
    "_load": (
        "decode_image",
        "load_audio",
        "load_image",
        "load_image_batch",
        "load_video",
        "load_video_clip",
    ),
    "_sample": ("sample_decode_video",),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

if TYPE_CHECKING:
    from ._async import (
        async_convert_frames,
        async_decode_packets,
        async_demux_audio,
        async_demux_image,
        async_demux_video,
        async_load_image_batch,
        async_sample_decode_video,
        async_transfer_tensor,
    )
    from ._convert import convert_frames, to_torch
    from ._decode import decode_packets, pick_lowres
    from ._demux import Packets, demux_audio, demux_image, demux_video
    from ._frames import AudioFrames, Frames, ImageFrames, VideoFrames
    from ._input import Source
    from ._load import (
        decode_image,
        load_audio,
        load_image,
        load_image_batch,
        load_video,
        load_video_clip,
    )
    from ._sample import sample_decode_video


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AudioFrames",
    "BufferPool",
    "CUDAConfig",
    "DEFAULT_MAX_PIXELS",
    "Frames",
    "ImageFrames",
    "MediaError",
    "Packets",
    "Source",
    "VideoFrames",
    "async_convert_frames",
    "async_decode_packets",
    "async_demux_audio",
    "async_demux_image",
    "async_demux_video",
    "async_load_image_batch",
    "async_sample_decode_video",
    "async_transfer_tensor",
    "convert_frames",
    "cuda_config",
    "decode_image",
    "decode_packets",
    "demux_audio",
    "demux_image",
    "demux_video",
    "get_audio_filter_desc",
    "get_video_filter_desc",
    "load_audio",
    "load_image",
    "load_image_batch",
    "load_video",
    "load_video_clip",
    "pick_lowres",
    "sample_decode_video",
    "to_torch",
    "transfer_tensor",
]
