"""The fields of a sample, decoded by their extension.

WebDataset names a field by its file extension, so the extension says how to decode it:
images, video and audio go to :mod:`torch_spdl.io` (FFmpeg through PyAV; a JPEG resized
to ``image_size`` is decoded at reduced resolution and resized in the same call, which
is most of this package's speed on image shards), the common small fields (``cls``,
``txt``, ``json``, ``npy``) to the obvious Python readers, and anything else stays
``bytes``. A user function given for an extension replaces the built-in one; decoding
happens on the pipeline's decode threads (PyAV releases the GIL).

Images come out as ``uint8`` tensors ``(C, H, W)``, as torchvision's transforms take
them; video as ``(T, C, H, W)``; audio as the ``(channels, samples)`` float tensor
:func:`torch_spdl.io.load_audio` makes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Decoder", "FieldDecoder"]

FieldDecoder = Callable[[bytes], Any]

IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif"})
VIDEO_EXTS = frozenset({"mp4", "avi", "mkv", "webm", "mov"})
AUDIO_EXTS = frozenset({"wav", "flac", "mp3", "ogg", "opus", "m4a"})


def _last_ext(ext: str) -> str:
    """``seg.jpg`` -> ``jpg``: WebDataset's multi-dot fields decode by their last part."""
    return ext.rsplit(".", 1)[-1]


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _json(data: bytes) -> Any:
    return json.loads(data)


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _torch(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


_SIMPLE: dict[str, FieldDecoder] = {
    "txt": _text,
    "text": _text,
    "cls": _int,
    "cls2": _int,
    "index": _int,
    "id": _int,
    "json": _json,
    "npy": _npy,
    "pth": _torch,
}


class Decoder:
    """Decodes a sample's fields: ``decode(fields) -> dict`` with the same keys.

    Args:
        image_size: ``(height, width)`` every image is resized to while it is decoded, or
            None for the stored size.
        overrides: ``{extension: function(bytes) -> value}``; a function replaces the
            built-in decoder of that extension (``None`` as the function keeps the bytes).
        media: False keeps images, video and audio as bytes.
    """

    def __init__(
        self,
        image_size: tuple[int, int] | None = None,
        overrides: Mapping[str, FieldDecoder | None] | None = None,
        media: bool = True,
    ) -> None:
        if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
            raise ValueError(f"image_size must be (height, width), got {image_size!r}")
        self.image_size = image_size
        self.overrides = {k.lower(): v for k, v in (overrides or {}).items()}
        self.media = media

    def field_decoder(self, ext: str) -> FieldDecoder | None:
        """The function that decodes a field named ``ext`` (None: keep the bytes)."""
        if ext in self.overrides:
            return self.overrides[ext]
        last = _last_ext(ext)
        if last in self.overrides:
            return self.overrides[last]
        if last in _SIMPLE:
            return _SIMPLE[last]
        if not self.media:
            return None
        if last in IMAGE_EXTS:
            return self._image
        if last in VIDEO_EXTS:
            return _video
        if last in AUDIO_EXTS:
            return _audio
        return None

    def import_media(self) -> None:
        """Import the media decoders (PyAV) now, when they may be needed: forked
        DataLoader workers inherit them instead of importing them before their first
        decode."""
        if self.media:
            from ..io import load_audio, load_image, load_video  # noqa: F401

    def __call__(self, fields: Mapping[str, bytes]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for ext, data in fields.items():
            fn = self.field_decoder(ext)
            try:
                out[ext] = data if fn is None else fn(data)
            except Exception as exc:
                exc.add_note(f"while decoding field {ext!r}")
                raise
        return out

    def _image(self, data: bytes) -> Any:
        import torch

        from ..io import load_image

        if self.image_size is None:
            array = load_image(data)
        else:
            height, width = self.image_size
            array = load_image(data, width=width, height=height)
        return torch.from_numpy(array).permute(2, 0, 1)


def _video(data: bytes) -> Any:
    import torch

    from ..io import load_video

    return torch.from_numpy(load_video(data)).permute(0, 3, 1, 2)


def _audio(data: bytes) -> Any:
    import torch

    from ..io import load_audio

    return torch.from_numpy(load_audio(data)).t().contiguous()
