"""torch_spdl.io: media decoding on PyAV (FFmpeg), batching into one buffer, GPU transfer.

Two layers, the names of SPDL's ``spdl.io``:

- building blocks: :func:`demux_image` / :func:`demux_video` / :func:`demux_audio` ->
  :func:`decode_packets` (with a :func:`get_video_filter_desc` chain run inside FFmpeg) ->
  :func:`convert_frames` (one contiguous NumPy buffer, reused from a :class:`BufferPool`
  if given) -> :func:`to_torch` (a view) ->
  :func:`transfer_tensor` (pinned memory, dedicated CUDA stream);
- one call: :func:`load_image`, :func:`load_image_batch`, :func:`load_video`,
  :func:`load_audio`.

Every input that cannot be read raises :class:`MediaError`, naming the source.
"""

from __future__ import annotations

from ._async import (
    async_convert_frames,
    async_decode_packets,
    async_demux_audio,
    async_demux_image,
    async_demux_video,
    async_load_image_batch,
    async_transfer_tensor,
)
from ._buffers import BufferPool
from ._convert import convert_frames, to_torch
from ._decode import decode_packets, pick_lowres
from ._demux import Packets, demux_audio, demux_image, demux_video
from ._errors import MediaError
from ._filter_desc import get_audio_filter_desc, get_video_filter_desc
from ._frames import AudioFrames, Frames, ImageFrames, VideoFrames
from ._input import Source
from ._load import decode_image, load_audio, load_image, load_image_batch, load_video
from ._transfer import CUDAConfig, cuda_config, transfer_tensor

__all__ = [
    "AudioFrames",
    "BufferPool",
    "CUDAConfig",
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
    "pick_lowres",
    "to_torch",
    "transfer_tensor",
]
