"""Decoding packets into frames, with the filter chain applied inside FFmpeg."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import av

from ._demux import Packets
from ._errors import MediaError
from ._filter import as_reformat, filter_graph, target_size
from ._frames import AudioFrames, Frames, ImageFrames, VideoFrames
from ._limits import check_size, decoder_limit

_LG = logging.getLogger(__name__)


def pick_lowres(src_w: int, src_h: int, dst_w: int, dst_h: int) -> int:
    """The largest MJPEG ``lowres`` (0-3) whose decoded size stays >= the target size."""
    for k in (3, 2, 1):
        if -(-src_w >> k) >= dst_w and -(-src_h >> k) >= dst_h:
            return k
    return 0


def image_options(
    codec: str, width: int, height: int, desc: str | None, options: dict[str, str] | None
) -> dict[str, str]:
    """Decoder options for one image: a truncated image is an error, not gray; an MJPEG
    image much larger than the filter's target size decodes at a ``lowres`` fraction."""
    opts = dict(options or {})
    opts.setdefault("err_detect", "explode")
    size = target_size(desc)
    if codec == "mjpeg" and size is not None and "lowres" not in opts:
        lowres = pick_lowres(width, height, *size)
        if lowres:
            opts["lowres"] = str(lowres)
    return opts


def configure_decoder(packets: Packets, desc: str | None, options: dict[str, str] | None) -> Any:
    """The stream's decoder with its options set; not opened yet, so nothing is decoded
    or allocated before the declared size has passed the pixel limit."""
    ctx = packets.stream.codec_context
    if ctx is None:
        raise MediaError(packets.source, "no decoder for the stream's codec")
    opts = dict(options or {})
    if packets.media_type != "audio":
        check_size(packets.source, ctx.width, ctx.height, packets.max_pixels)
        for key, value in decoder_limit(packets.max_pixels, ctx.width, ctx.height).items():
            opts.setdefault(key, value)
    if packets.media_type == "image":
        opts = image_options(ctx.name, ctx.width, ctx.height, desc, opts)
    if packets.media_type == "video" and "threads" not in opts:
        ctx.thread_type = "AUTO"
    if opts:
        ctx.options = opts
    return ctx


def _decoded(packets: Packets, ctx: Any) -> Iterator[Any]:
    time_base = packets.stream.time_base
    for packet in [*packets.packets, None]:
        for frame in ctx.decode(packet):
            if frame.time_base is None and time_base is not None:
                frame.time_base = time_base  # frames flushed at the end come without one
            yield frame


def _in_window(frames: Iterator[Any], window: tuple[float, float] | None) -> Iterator[Any]:
    for frame in frames:
        t = frame.time
        if window is not None and t is not None and not math.isnan(t):
            if not window[0] <= t < window[1]:
                continue
        yield frame


def _limit_hint(packets: Packets) -> str:
    """A note for a picture whose size was unknown until the decoder refused it: FFmpeg's
    error for a frame over the decoder's ``max_pixels`` says only "invalid"."""
    ctx = packets.stream.codec_context
    if packets.media_type == "audio" or packets.max_pixels is None or ctx.width:
        return ""
    return (
        f" (its size was unknown before decoding: it may be over max_pixels={packets.max_pixels:,})"
    )


def decode_packets(
    packets: Packets,
    *,
    filter_desc: str | None = None,
    decoder_options: dict[str, str] | None = None,
) -> Frames:
    """Decode ``packets`` and run the frames through ``filter_desc`` (see
    :func:`get_video_filter_desc`). Returns :class:`ImageFrames`, :class:`VideoFrames` or
    :class:`AudioFrames`. Closes the packets' container. Raises :class:`MediaError`.

    Pictures are held to ``packets.max_pixels`` (set by :func:`demux_image` /
    :func:`demux_video`): the declared size is checked before decoding, and the decoder
    refuses a frame over it whose size shows up only while decoding.
    """
    try:
        ctx = configure_decoder(packets, filter_desc, decoder_options)
        frames = _in_window(_decoded(packets, ctx), packets.window)
        if filter_desc:
            reformat = None if packets.media_type == "audio" else as_reformat(filter_desc)
            if reformat is not None:
                frames = (reformat.apply(f) for f in frames)
            else:
                frames = filter_graph(frames, filter_desc, packets.media_type)
        out = list(frames)
    except (av.FFmpegError, ValueError, OSError) as e:
        raise MediaError(packets.source, f"cannot decode: {e}{_limit_hint(packets)}") from e
    finally:
        packets.container.close()
    if not out:
        raise MediaError(packets.source, "no frame decoded")
    _LG.debug("%s: decoded %d frames", packets.source, len(out))
    kind = {"image": ImageFrames, "video": VideoFrames, "audio": AudioFrames}
    return kind[packets.media_type](packets.source, out)
