"""The simple layer: one call from a path or bytes to a NumPy array."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._buffers import BufferPool
from ._convert import convert_frames
from ._decode import decode_packets, image_options
from ._demux import demux_audio, demux_image, demux_video
from ._direct import decode_direct, direct_codec
from ._errors import MediaError
from ._filter import as_reformat
from ._filter_desc import get_audio_filter_desc, get_video_filter_desc
from ._frames import ImageFrames, VideoFrames
from ._image_size import declared_size
from ._input import Source, describe, read_bytes
from ._limits import DEFAULT_MAX_PIXELS, check_size, decoder_limit
from ._sample import count_frames, draw_start, sample_decode_video

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
    codec = direct_codec(data) if reformat is not None else None
    size = declared_size(data) if codec is not None else None
    if reformat is not None and codec is not None and size is not None:
        # the common case: a JPEG or PNG, resized and converted: no container (_direct)
        check_size(label, *size, max_pixels)
        options = image_options(codec, *size, desc, decoder_limit(max_pixels, *size))
        frame = reformat.apply(decode_direct(codec, data, label, options))
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
    times: Sequence[float] | None = None,
    width: int | None = None,
    height: int | None = None,
    pix_fmt: str = "rgb24",
    scale_algo: str = "bilinear",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Load a clip, or some of its frames, as a ``uint8`` array ``(T, H, W, C)``.

    Args:
        src: a path, or the encoded bytes.
        timestamp: ``(start, end)`` in seconds: the frames shown in ``[start, end)``.
        indices: only these frame numbers (presentation order, counted from the window's
            first frame, or from the start); decoded by :func:`sample_decode_video`, so
            only the spans from a key frame to each wanted frame are decoded, and only
            the kept frames are scaled. An index may repeat; negative ones count from
            the end.
        times: instead of ``indices``: the frames shown at these times (seconds).
        width: the output width (given alone, the aspect ratio is kept).
        height: the output height (given alone, the aspect ratio is kept).
        pix_fmt: the output pixel format.
        scale_algo: FFmpeg's scaling algorithm.
        max_pixels: frames declaring more pixels (width x height, before any resize) raise
            :class:`MediaError` before any is decoded; None: no limit. The limit is per
            frame.

    Raises:
        MediaError: naming the source, for media that cannot be read and for an index or
            time out of range.
    """
    if indices is not None and times is not None:
        raise TypeError("give indices= or times=, not both")
    if times is not None and timestamp is not None:
        raise TypeError("times= are on the stream's clock: do not combine them with timestamp=")
    desc = get_video_filter_desc(
        scale_width=width, scale_height=height, scale_algo=scale_algo, pix_fmt=pix_fmt
    )
    packets = demux_video(src, timestamp=timestamp, max_pixels=max_pixels)
    if indices is not None or times is not None:
        picked = sample_decode_video(packets, indices, times=times, filter_desc=desc)
        return convert_frames(picked)
    frames = decode_packets(packets, filter_desc=desc)
    assert isinstance(frames, VideoFrames)
    return convert_frames(frames)


def load_video_clip(
    src: Source,
    num_frames: int,
    *,
    stride: int = 1,
    generator: Any = None,
    short: str = "pad",
    width: int | None = None,
    height: int | None = None,
    pix_fmt: str = "rgb24",
    scale_algo: str = "bilinear",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """A random clip for training: ``num_frames`` frames, ``stride`` apart, from a random
    start, as a ``uint8`` array ``(num_frames, H, W, C)``. One demux; only the clip's
    frames (and those from the key frame before it) are decoded.

    Args:
        src: a path, or the encoded bytes.
        num_frames: frames in the clip.
        stride: take every ``stride``-th frame.
        generator: where the start comes from: a ``numpy.random.Generator``, a
            ``torch.Generator``, or an int seed. None draws from a fresh generator seeded
            by the OS, never from a global RNG (pass one to make runs repeatable).
        short: a video with fewer frames than the clip spans: ``"pad"`` starts at frame 0
            and repeats the last frame to ``num_frames`` (batches keep one shape);
            ``"error"`` raises :class:`MediaError`.
        width: the output width (given alone, the aspect ratio is kept).
        height: the output height (given alone, the aspect ratio is kept).
        pix_fmt: the output pixel format.
        scale_algo: FFmpeg's scaling algorithm.
        max_pixels: the pixel limit of :func:`load_video`.

    Raises:
        MediaError: naming the source, for media that cannot be read, and for a short
            video with ``short="error"``.
    """
    if num_frames < 1 or stride < 1:
        raise ValueError(f"num_frames and stride must be >= 1, got {num_frames}, {stride}")
    if short not in ("pad", "error"):
        raise ValueError(f"short must be 'pad' or 'error', got {short!r}")
    desc = get_video_filter_desc(
        scale_width=width, scale_height=height, scale_algo=scale_algo, pix_fmt=pix_fmt
    )
    packets = demux_video(src, max_pixels=max_pixels)
    available = count_frames(packets)
    span = (num_frames - 1) * stride + 1
    if available >= span:
        start = draw_start(generator, available - span + 1)
        indices = [start + k * stride for k in range(num_frames)]
    elif short == "error":
        packets.container.close()
        raise MediaError(packets.source, f"has {available} frames, fewer than the clip's {span}")
    else:
        _LG.debug("%s: %d frames for a clip of %d: padded", packets.source, available, span)
        indices = [min(k * stride, available - 1) for k in range(num_frames)]
    return convert_frames(sample_decode_video(packets, indices, filter_desc=desc))


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
