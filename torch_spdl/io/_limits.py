"""The pixel limit: a picture that declares more pixels than this is refused undecoded.

A PNG of 249 KB may declare 16000x16000 pixels: 732 MiB as RGB, allocated before any
resize to 224x224 can happen, and allocated already while the container is opened (FFmpeg
decodes an image once to learn its size). Such a file in a data set, hostile or broken,
takes a worker's memory with it. So the probe decode that opening does is held to the
limit (a decoder option), and the declared size (the stream's codec parameters, or the
image's header, see ``_image_size``) is checked before the real decode starts.

The default is PIL's ``Image.MAX_IMAGE_PIXELS``. PIL only warns up to twice that and
raises above it; here there is one rule, raise above the limit, because a warning in a
data loader's log goes unread while the memory is gone.

The limit is a keyword argument (``max_pixels``) rather than a module setting: a setting
changed in the training script would not reach worker processes started with ``spawn``,
while an argument travels with the call (a ``functools.partial`` pickles).
"""

from __future__ import annotations

from ._errors import MediaError

DEFAULT_MAX_PIXELS = 89_478_485
"""The default ``max_pixels``: width x height above this raises :class:`MediaError`
(PIL's ``Image.MAX_IMAGE_PIXELS``, 1024 * 1024 * 1024 // 4 // 3)."""

# FFmpeg's ``max_pixels`` decoder option is an int; its default (no limit) is INT_MAX.
_FFMPEG_MAX = 2**31 - 1
# FFmpeg rounds the width up to a multiple of STRIDE_ALIGN (at most 64) for that check.
_ROW_ALIGN = 64


def check_max_pixels(max_pixels: int | None) -> None:
    """Refuse a ``max_pixels`` that is not a positive int or None (a caller's mistake, so
    ``ValueError``/``TypeError``, not :class:`MediaError`)."""
    if max_pixels is None:
        return
    if not isinstance(max_pixels, int) or isinstance(max_pixels, bool):
        raise TypeError(f"max_pixels must be an int or None, not {type(max_pixels).__name__}")
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be >= 1 or None, not {max_pixels}")


def check_size(source: str, width: int, height: int, max_pixels: int | None) -> None:
    """Raise :class:`MediaError` naming ``source`` and the limit if a ``width`` x ``height``
    picture is over ``max_pixels``.

    An unknown size (0) passes: the decoder option of :func:`decoder_limit` still holds.
    """
    check_max_pixels(max_pixels)
    if max_pixels is None or width * height <= max_pixels:
        return
    raise MediaError(
        source,
        f"declares {width}x{height} = {width * height:,} pixels, over the limit "
        f"max_pixels={max_pixels:,}; not decoded (pass a larger max_pixels, or None, "
        "to decode it)",
    )


def decoder_limit(max_pixels: int | None, width: int = 0, height: int = 0) -> dict[str, str]:
    """FFmpeg options that hold the limit inside the decoder too: for a size that shows up
    only while decoding (a stream that declares none, or changes size mid-stream), and for
    the frame ``avformat_find_stream_info`` decodes while a container is opened.

    FFmpeg checks its ``max_pixels`` again when it allocates a frame, against the width
    padded to its row alignment, so a declared ``width`` x ``height`` that passed
    :func:`check_size` is given that padding here (else 9500x9500 would fail a limit of
    9500 * 9500).
    """
    if max_pixels is None:
        return {}
    padded = -(-width // _ROW_ALIGN) * _ROW_ALIGN * height
    limit = max(max_pixels, padded)
    if limit >= _FFMPEG_MAX:
        return {}
    return {"max_pixels": str(limit)}
