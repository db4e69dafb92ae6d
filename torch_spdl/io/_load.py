"""The simple layer: one call from a path or bytes to a NumPy array."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from ._buffers import BufferPool
from ._convert import convert_frames
from ._decode import decode_packets, image_options
from ._demux import demux_audio, demux_image, demux_video
from ._errors import MediaError
from ._filter import as_reformat
from ._filter_desc import get_audio_filter_desc, get_video_filter_desc
from ._frames import ImageFrames, VideoFrames
from ._input import Source, describe, read_bytes
from ._jpeg import decode_jpeg, is_jpeg, jpeg_size
from ._limits import DEFAULT_MAX_PIXELS, check_size, decoder_limit

_LG = logging.getLogger(__name__)


def decode_image(
    src: Source,
    *,
    width: int | None = None,
    height: int | None = None,
    crop_width: int | None = None,
    crop_height: int | None = None,
    pix_fmt: str = "rgb24",
    scale_algo: str = "bilinear",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> ImageFrames:
    """Demux and decode one image, resized/cropped/converted inside FFmpeg.

    Args:
        src: a path, or the encoded bytes.
        width: the output width (given alone, the aspect ratio is kept).
        height: the output height (given alone, the aspect ratio is kept).
        crop_width: the width of a center crop, taken after the resize.
        crop_height: the height of a center crop, taken after the resize.
        pix_fmt: the output pixel format.
        scale_algo: FFmpeg's scaling algorithm.
        max_pixels: an image that declares more pixels (width x height, before any
            resize) raises :class:`MediaError` before it is decoded; None: no limit.
    """
    desc = get_video_filter_desc(
        scale_width=width,
        scale_height=height,
        scale_algo=scale_algo,
        crop_width=crop_width,
        crop_height=crop_height,
        pix_fmt=pix_fmt,
    )
    label = describe(src)
    data = read_bytes(src, label)
    reformat = as_reformat(desc)
    size = jpeg_size(data) if reformat is not None and is_jpeg(data) else None
    if reformat is not None and size is not None:  # the common case: a JPEG, resized
        check_size(label, *size, max_pixels)
        options = image_options("mjpeg", *size, desc, decoder_limit(max_pixels, *size))
        frame = reformat.apply(decode_jpeg(data, label, options))
        return ImageFrames(label, [frame])
    packets = demux_image(data, name=label, max_pixels=max_pixels)
    frames = decode_packets(packets, filter_desc=desc)
    assert isinstance(frames, ImageFrames)
    return frames


def load_image(
    src: Source,
    *,
    width: int | None = None,
    height: int | None = None,
    crop_width: int | None = None,
    crop_height: int | None = None,
    pix_fmt: str = "rgb24",
    scale_algo: str = "bilinear",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Load one image as a ``uint8`` array ``(H, W, C)``. Raises :class:`MediaError`.

    The arguments are :func:`decode_image`'s, ``max_pixels`` (the pixel limit) included.
    """
    frames = decode_image(
        src,
        width=width,
        height=height,
        crop_width=crop_width,
        crop_height=crop_height,
        pix_fmt=pix_fmt,
        scale_algo=scale_algo,
        max_pixels=max_pixels,
    )
    return convert_frames([frames])[0]


def load_image_batch(
    srcs: Sequence[Source],
    *,
    width: int,
    height: int,
    pix_fmt: str = "rgb24",
    scale_algo: str = "bilinear",
    strict: bool = True,
    pool: BufferPool | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decode and resize images into ONE ``uint8`` buffer ``(N, height, width, C)``.

    With ``strict=False`` an image that fails is logged and left out (the batch is
    shorter); with ``strict=True`` (default) the first failure raises :class:`MediaError`.
    All failing raises :class:`MediaError` either way. ``pool``: see :func:`convert_frames`.
    ``max_pixels``: the pixel limit of :func:`decode_image`; an image over it fails.
    """
    frames: list[ImageFrames] = []
    for src in srcs:
        try:
            frames.append(
                decode_image(
                    src,
                    width=width,
                    height=height,
                    pix_fmt=pix_fmt,
                    scale_algo=scale_algo,
                    max_pixels=max_pixels,
                )
            )
        except MediaError as e:
            if strict:
                raise
            _LG.warning("skipping image: %s", e)
    if not frames:
        raise MediaError(f"<batch of {len(srcs)}>", "no image could be decoded")
    return convert_frames(frames, pool=pool)


def load_video(
    src: Source,
    *,
    timestamp: tuple[float, float] | None = None,
    indices: Sequence[int] | None = None,
    width: int | None = None,
    height: int | None = None,
    pix_fmt: str = "rgb24",
    scale_algo: str = "bilinear",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Load a clip as a ``uint8`` array ``(T, H, W, C)``.

    ``timestamp=(start, end)`` keeps the frames shown in ``[start, end)`` seconds;
    ``indices`` keeps those frame numbers (counted from the window's first frame, or from
    the start). Raises :class:`MediaError` (also when an index is out of range).
    ``max_pixels``: frames declaring more pixels (width x height, before any resize) raise
    :class:`MediaError` before any is decoded; None: no limit. The limit is per frame.
    """
    desc = get_video_filter_desc(
        scale_width=width, scale_height=height, scale_algo=scale_algo, pix_fmt=pix_fmt
    )
    packets = demux_video(src, timestamp=timestamp, max_pixels=max_pixels)
    frames = decode_packets(packets, filter_desc=desc)
    assert isinstance(frames, VideoFrames)
    if indices is not None:
        n = len(frames.frames)
        bad = [i for i in indices if not -n <= i < n]
        if bad:
            raise MediaError(frames.source, f"frame indices {bad} out of range (clip has {n})")
        frames = VideoFrames(frames.source, [frames.frames[i] for i in indices])
    return convert_frames(frames)


def load_audio(
    src: Source,
    *,
    timestamp: tuple[float, float] | None = None,
    sample_rate: int | None = None,
    num_channels: int | None = None,
) -> np.ndarray:
    """Load audio as ``float32`` ``(num_samples, num_channels)``, resampled in FFmpeg to
    ``sample_rate``/``num_channels`` when given. Raises :class:`MediaError`."""
    desc = get_audio_filter_desc(
        sample_rate=sample_rate, num_channels=num_channels, sample_fmt="flt"
    )
    frames = decode_packets(demux_audio(src, timestamp=timestamp), filter_desc=desc)
    return convert_frames(frames)
