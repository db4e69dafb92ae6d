"""The one error type raised for media that cannot be read."""

from __future__ import annotations


class MediaError(Exception):
    """Raised when an input cannot be demuxed or decoded.

    Corrupted, truncated, empty and non-media inputs all raise this error. ``source`` names
    the input (a path, or ``<bytes: N>`` for data in memory); ``reason`` says what failed.
    """

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason
