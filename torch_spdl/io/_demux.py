"""Demuxing: reading the encoded packets of one stream out of a container."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import av

from ._errors import MediaError
from ._input import Source, describe, open_container

_LG = logging.getLogger(__name__)


@dataclass
class Packets:
    """The encoded packets of one stream, with the (still open) container they came from.

    ``media_type`` is ``"image"``, ``"video"`` or ``"audio"``. ``window`` is an optional
    ``(start, end)`` range in seconds that :func:`decode_packets` keeps frames from.
    """

    source: str
    media_type: str
    container: Any = field(repr=False)
    stream: Any = field(repr=False)
    packets: list[Any] = field(repr=False)
    window: tuple[float, float] | None = None

    def __len__(self) -> int:
        return len(self.packets)


def _demux(
    src: Source, kind: str, media_type: str, window: tuple[float, float] | None, name: str | None
) -> Packets:
    label = name or describe(src)
    container = open_container(src, label)
    try:
        streams = container.streams.video if kind == "video" else container.streams.audio
        if not streams:
            raise MediaError(label, f"no {kind} stream")
        stream = streams[0]
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
    return Packets(label, media_type, container, stream, packets, window)


def demux_image(src: Source, *, name: str | None = None) -> Packets:
    """Read the packet of an image (JPEG, PNG, ... by content) from a path or bytes."""
    return _demux(src, "video", "image", None, name)


def demux_video(
    src: Source, *, timestamp: tuple[float, float] | None = None, name: str | None = None
) -> Packets:
    """Read the video packets of ``src``; ``timestamp=(start, end)`` keeps that window (s)."""
    return _demux(src, "video", "video", timestamp, name)


def demux_audio(
    src: Source, *, timestamp: tuple[float, float] | None = None, name: str | None = None
) -> Packets:
    """Read the audio packets of ``src``; ``timestamp=(start, end)`` keeps that window (s)."""
    return _demux(src, "audio", "audio", timestamp, name)
