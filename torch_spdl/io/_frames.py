"""Decoded frames, as FFmpeg produced them (not yet copied into one buffer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Frames:
    """Decoded frames of one source. ``frames`` are PyAV frames, in presentation order."""

    source: str
    frames: list[Any] = field(repr=False)

    def __len__(self) -> int:
        return len(self.frames)


@dataclass
class ImageFrames(Frames):
    """The frame of one decoded image."""

    @property
    def width(self) -> int:
        """Width in pixels."""
        return int(self.frames[0].width)

    @property
    def height(self) -> int:
        """Height in pixels."""
        return int(self.frames[0].height)

    @property
    def pix_fmt(self) -> str:
        """FFmpeg pixel format name (``rgb24``...)."""
        return str(self.frames[0].format.name)


@dataclass
class VideoFrames(ImageFrames):
    """The frames of a decoded video clip."""


@dataclass
class AudioFrames(Frames):
    """The frames of decoded audio."""

    @property
    def sample_rate(self) -> int:
        """Samples per second."""
        return int(self.frames[0].sample_rate)

    @property
    def num_channels(self) -> int:
        """Number of channels."""
        return len(self.frames[0].layout.channels)
