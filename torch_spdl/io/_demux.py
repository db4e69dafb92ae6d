"""Demuxing: reading the encoded packets of one stream out of a container."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import av

from ._errors import MediaError
from ._image_size import declared_size
from ._input import Source, describe, open_container, read_bytes
from ._limits import DEFAULT_MAX_PIXELS, check_max_pixels, check_size, decoder_limit

_LG = logging.getLogger(__name__)


@dataclass
class Packets:
    """The encoded packets of one stream, with the (still open) container they came from.

    ``media_type`` is ``"image"``, ``"video"`` or ``"audio"``. ``window`` is an optional
    ``(start, end)`` range in seconds that :func:`decode_packets` keeps frames from.
    ``max_pixels`` is the pixel limit the demuxer checked, which :func:`decode_packets`
    also holds the decoder to (None: no limit).
    """

    source: str
    media_type: str
    container: Any = field(repr=False)
    stream: Any = field(repr=False)
    packets: list[Any] = field(repr=False)
    window: tuple[float, float] | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __len__(self) -> int:
        return len(self.packets)


def _declared_size(src: Source, media_type: str, ctx: Any, label: str) -> tuple[int, int]:
    """The picture size the stream declares; for an image whose size the (limited) probe
    could not learn, the size its header declares. ``(0, 0)`` when unknown."""
    if media_type == "image" and not (ctx.width and ctx.height):
        return declared_size(read_bytes(src, label)) or (0, 0)
    return ctx.width, ctx.height


def _checked_stream(
    container: Any, src: Source, kind: str, media_type: str, label: str, max_pixels: int | None
) -> Any:
    """The first ``kind`` stream, once it has a decoder and an acceptable declared size."""
    streams = container.streams.video if kind == "video" else container.streams.audio
    if not streams:
        raise MediaError(label, f"no {kind} stream")
    stream = streams[0]
    ctx = stream.codec_context
    if ctx is None:  # FFmpeg knows no decoder for the codec the container names
        raise MediaError(label, f"no decoder for the {kind} stream's codec")
    if kind == "video":
        check_size(label, *_declared_size(src, media_type, ctx, label), max_pixels)
    return stream


def _demux(
    src: Source,
    kind: str,
    media_type: str,
    window: tuple[float, float] | None,
    name: str | None,
    max_pixels: int | None,
) -> Packets:
    check_max_pixels(max_pixels)
    label = name or describe(src)
    container = open_container(src, label, decoder_limit(max_pixels))
    try:
        stream = _checked_stream(container, src, kind, media_type, label, max_pixels)
        if window is not None and window[0] > 0 and stream.time_base is not None:
            offset = int(window[0] / stream.time_base)
            container.seek(offset, stream=stream, backward=True, any_frame=False)
        packets = []
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            if window is not None and packet.pts is not None and packet.time_base is not None:
                # Packets may arrive out of presentation order (B-frames), so read a
                # little past the end of the window before stopping.
                if float(packet.pts * packet.time_base) > window[1] + 1.0:
                    break
            packets.append(packet)
    except MediaError:
        container.close()
        raise
    except (av.FFmpegError, OSError, ValueError) as e:
        container.close()
        raise MediaError(label, f"cannot demux: {e}") from e
    if not packets:
        container.close()
        raise MediaError(label, f"no {kind} packets")
    _LG.debug("%s: %d %s packets", label, len(packets), kind)
    return Packets(label, media_type, container, stream, packets, window, max_pixels)


def demux_image(
    src: Source, *, name: str | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> Packets:
    """Read the packet of an image (JPEG, PNG, ... by content) from a path or bytes.

    Args:
        src: a path, or the encoded bytes.
        name: how errors name the source (default: the path, or ``<bytes: N>``).
        max_pixels: an image that declares more pixels (width x height) raises
            :class:`MediaError` before anything is decoded; None: no limit.
    """
    return _demux(src, "video", "image", None, name, max_pixels)


def demux_video(
    src: Source,
    *,
    timestamp: tuple[float, float] | None = None,
    name: str | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Packets:
    """Read the video packets of ``src``.

    Args:
        src: a path, or the encoded bytes.
        timestamp: ``(start, end)`` in seconds: keep that window.
        name: how errors name the source (default: the path, or ``<bytes: N>``).
        max_pixels: a stream whose frames declare more pixels (width x height) raises
            :class:`MediaError` before anything is decoded; None: no limit.
    """
    return _demux(src, "video", "video", timestamp, name, max_pixels)


def demux_audio(
    src: Source, *, timestamp: tuple[float, float] | None = None, name: str | None = None
) -> Packets:
    """Read the audio packets of ``src``; ``timestamp=(start, end)`` keeps that window (s).

    A video stream beside the audio is held to the default pixel limit while the
    container is probed (probing may decode one of its frames).
    """
    return _demux(src, "audio", "audio", timestamp, name, DEFAULT_MAX_PIXELS)
