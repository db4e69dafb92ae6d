"""JPEG headers: whether bytes are a JPEG, and the size its frame header declares.

The size is read here, without decoding, so that the pixel limit is checked and the MJPEG
``lowres`` option chosen before the image is decoded (``_direct`` decodes it).
"""

from __future__ import annotations

_SOI = b"\xff\xd8\xff"
# Start-of-frame markers C0-CF carry the image size, except C4 (DHT), C8 (reserved) and CC (DAC).
_NOT_SOF = {0xC4, 0xC8, 0xCC}


def is_jpeg(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a JPEG file."""
    return bytes(data[:3]) == _SOI


def jpeg_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(width, height)`` from the JPEG frame header, or None unless the marker segments
    from the start of the image to the start of the scan are well formed (anything else
    goes through the container path, whose probe rejects it with a clear error)."""
    view = memoryview(data)
    i, n, size = 2, len(view), None
    while i + 4 <= n:
        if view[i] != 0xFF:
            return None
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:  # markers without a length
            i += 2
            continue
        length = (view[i + 2] << 8) | view[i + 3]
        if length < 2 or i + 2 + length > n:
            return None
        if marker == 0xDA:  # start of scan: the header is complete
            return size
        if 0xC0 <= marker <= 0xCF and marker not in _NOT_SOF and length >= 8:
            height = (view[i + 5] << 8) | view[i + 6]
            width = (view[i + 7] << 8) | view[i + 8]
            size = (width, height) if width and height else None
        i += 2 + length
    return None
