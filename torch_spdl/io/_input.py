"""Opening a path or bytes in memory as a PyAV container, with errors mapped to MediaError."""

from __future__ import annotations

import io
import os
from typing import Any, Union

import av

from ._errors import MediaError

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]
"""A path, or the encoded data itself."""


def describe(src: Source) -> str:
    """Name a source for messages: its path, or ``<bytes: N>`` for data in memory."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return f"<bytes: {len(src)}>"
    return os.fspath(src)


def read_bytes(src: Source, name: str) -> bytes | bytearray | memoryview:
    """The encoded data of ``src``: itself if in memory, else the file's contents."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = src
    else:
        try:
            with open(src, "rb") as f:
                data = f.read()
        except OSError as e:
            raise MediaError(name, f"cannot open: {e}") from e
    if len(data) == 0:
        raise MediaError(name, "empty input")
    return data


def open_container(src: Source, name: str, options: dict[str, str] | None = None) -> Any:
    """Open ``src`` for reading; raise :class:`MediaError` naming ``name`` on failure.

    ``options`` go to the demuxer and to the decoders that probing opens (the limits of
    ``_limits.decoder_limit``: probing decodes a frame of some streams, H.264 among them).
    """
    if isinstance(src, (bytes, bytearray, memoryview)):
        if len(src) == 0:
            raise MediaError(name, "empty input")
        target: Any = io.BytesIO(src)
    else:
        target = os.fspath(src)
    try:
        return av.open(target, mode="r", options=options or {})
    except (av.FFmpegError, OSError, ValueError) as e:
        raise MediaError(name, f"cannot open: {e}") from e
