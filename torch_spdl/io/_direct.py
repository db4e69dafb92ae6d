"""Decoding a single-packet image (JPEG, PNG) without opening a container.

Opening a container costs twice over for an image. ``avformat_open_input`` probes the
input format and builds demuxer state, about as long as decoding a small JPEG; and
``avformat_find_stream_info`` then *decodes the whole image* to learn its size and pixel
format, before :func:`~torch_spdl.io.decode_packets` decodes it again (for a PNG that is
half the work thrown away). A JPEG or PNG file is one packet, so when the bytes start
like one we hand them to a fresh decoder ourselves. The size comes from the header
(``_image_size``), so the pixel limit is checked and, for JPEG, the ``lowres`` option
chosen before decoding. The decoded frame equals the container path's (tested).
"""

from __future__ import annotations

from typing import Any

import av

from ._errors import MediaError
from ._jpeg import is_jpeg

_PNG = b"\x89PNG\r\n\x1a\n"


def direct_codec(data: bytes | bytearray | memoryview) -> str | None:
    """The decoder for ``data`` if it is a single-packet image we decode directly."""
    if is_jpeg(data):
        return "mjpeg"
    if bytes(data[:8]) == _PNG:
        return "png"
    return None


def decode_direct(
    codec: str, data: bytes | bytearray | memoryview, label: str, options: dict[str, str]
) -> Any:
    """Decode one image packet with a fresh ``codec`` decoder; return the PyAV frame.

    A new decoder per image (about 20 us) keeps no state between images, so a broken
    image cannot affect the next one. Raises :class:`MediaError` naming ``label``.
    """
    try:
        ctx: Any = av.CodecContext.create(codec, "r")
        ctx.options = options
        frames = ctx.decode(av.Packet(bytes(data)))
        frames += ctx.decode(None)
    except (av.FFmpegError, ValueError) as e:
        raise MediaError(label, f"cannot decode: {e}") from e
    if not frames:
        raise MediaError(label, "no frame decoded")
    return frames[0]
