"""The size an image declares in its header, read without decoding it.

FFmpeg's image demuxers do not read the size: opening the container decodes the whole
image once to learn it (``avformat_find_stream_info``), so an image over the pixel limit
would be allocated before the limit could be checked. The container is therefore opened
with the limit passed to that probe decode, which then refuses the image and leaves its
size unknown; the header read here gives the size back for the error message. Formats not
read here are still refused, by the decoder, with FFmpeg's own message.
"""

from __future__ import annotations

from ._jpeg import is_jpeg, jpeg_size

_PNG = b"\x89PNG\r\n\x1a\n"


def _u16le(b: bytes, i: int) -> int:
    return b[i] | b[i + 1] << 8


def _u24le(b: bytes, i: int) -> int:
    return b[i] | b[i + 1] << 8 | b[i + 2] << 16


def _u32le(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 4], "little")


def _u32be(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 4], "big")


def _webp_size(b: bytes) -> tuple[int, int] | None:
    chunk = b[12:16]
    if chunk == b"VP8X" and len(b) >= 30:  # extended: the canvas size
        return _u24le(b, 24) + 1, _u24le(b, 27) + 1
    if chunk == b"VP8L" and len(b) >= 25 and b[20] == 0x2F:  # lossless: 14-bit sizes - 1
        bits = _u32le(b, 21)
        return (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1
    if chunk == b"VP8 " and len(b) >= 30 and b[23:26] == b"\x9d\x01\x2a":  # lossy key frame
        return _u16le(b, 26) & 0x3FFF, _u16le(b, 28) & 0x3FFF
    return None


def declared_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(width, height)`` from the header of a PNG, JPEG, GIF, BMP or WebP image, or
    None for another format or a header too short to say."""
    b = bytes(data[:32])
    if b.startswith(_PNG) and b[12:16] == b"IHDR" and len(b) >= 24:
        return _u32be(b, 16), _u32be(b, 20)
    if b[:6] in (b"GIF87a", b"GIF89a") and len(b) >= 10:
        return _u16le(b, 6), _u16le(b, 8)
    if b.startswith(b"BM") and len(b) >= 26:
        if _u32le(b, 14) == 12:  # OS/2 header: 16-bit sizes
            return _u16le(b, 18), _u16le(b, 20)
        width = int.from_bytes(b[18:22], "little", signed=True)
        height = int.from_bytes(b[22:26], "little", signed=True)  # < 0: stored top-down
        return abs(width), abs(height)
    if b.startswith(b"RIFF") and b[8:12] == b"WEBP":
        return _webp_size(b)
    if is_jpeg(data):
        return jpeg_size(data)
    return None
