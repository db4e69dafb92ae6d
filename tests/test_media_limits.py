"""torch_spdl.io against hostile media: pictures over the pixel limit, fuzzed containers.

A picture over ``max_pixels`` must be refused from its declared size, before anything is
decoded. The tests show that by giving the oversized images data that cannot be decoded at
all (a few rows of pixels, or none): had the decoder run, the error would be a decoding
error, not the limit's.
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

import torch_spdl.io as tio


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(width: int, height: int, *, bit_depth: int = 8, color_type: int = 2, rows: int) -> bytes:
    """A PNG declaring ``width`` x ``height`` whose pixel data holds ``rows`` black rows
    (all of them: a valid image; fewer: a truncated one). Made by hand, so that a huge
    declared size costs nothing to build."""
    channels = {0: 1, 2: 3}[color_type]
    row = bytes(1 + (width * channels * bit_depth + 7) // 8)  # filter byte + pixels
    z = zlib.compressobj(9)
    idat = b"".join([*(z.compress(row) for _ in range(rows)), z.flush()])
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def _encode(fmt: str, **params: object) -> bytes:
    arr = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **params)
    return buf.getvalue()


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header is changed to declare ``width`` x ``height``."""
    data = bytearray(_encode("JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _clip(
    fmt: str = "mp4", codec: str = "libx264", frames: int = 16, size: tuple[int, int] = (64, 48)
) -> bytes:
    """``frames`` frames of ``size`` at 10 fps, in memory."""
    if codec not in av.codecs_available:
        codec = "mpeg4"
    width, height = size
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            arr = np.full((height, width, 3), 15 * i, dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")))
        out.mux(stream.encode(None))
    return buf.getvalue()


LIMIT = "over the limit max_pixels=89,478,485"


def test_default_limit_is_pils() -> None:
    assert tio.DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS == 89_478_485


# -- pictures over the limit -----------------------------------------------------------------
_LOADERS: dict[str, Callable[[tio.Source], object]] = {
    "load_image": lambda src: tio.load_image(src, width=224, height=224),
    "load_image full size": lambda src: tio.load_image(src),
    "load_image_batch": lambda src: tio.load_image_batch([src], width=224, height=224),
    "demux_image": lambda src: tio.decode_packets(tio.demux_image(src)),
}


@pytest.mark.parametrize("loader", list(_LOADERS))
@pytest.mark.parametrize("as_path", [False, True], ids=["bytes", "path"])
def test_16000x16000_png_is_refused_before_decoding(
    loader: str, as_path: bool, tmp_path: Path
) -> None:
    """The case of the issue: a small PNG that declares 16000x16000 (732 MiB decoded as
    RGB; this one is 1-bit gray, so that a regression costs 32 MiB, not gigabytes)."""
    data = _png(16000, 16000, bit_depth=1, color_type=0, rows=1)
    src: tio.Source = data
    if as_path:
        src = tmp_path / "bomb.png"
        src.write_bytes(data)
    with pytest.raises(tio.MediaError) as info:
        _LOADERS[loader](src)
    assert info.value.source == (str(src) if as_path else f"<bytes: {len(data)}>")
    assert str(info.value).startswith(info.value.source)
    assert "declares 16000x16000 = 256,000,000 pixels" in info.value.reason
    assert LIMIT in info.value.reason


@pytest.mark.parametrize("loader", ["load_image", "load_image full size", "demux_image"])
def test_jpeg_declaring_16000x16000_is_refused_before_decoding(loader: str) -> None:
    """Both the JPEG path without a container (resized) and the container path."""
    with pytest.raises(tio.MediaError, match="declares 16000x16000") as info:
        _LOADERS[loader](_jpeg_declaring(16000, 16000))
    assert LIMIT in info.value.reason


@pytest.mark.parametrize(
    "fmt, params",
    [
        ("PNG", {}),
        ("JPEG", {}),
        ("GIF", {}),
        ("BMP", {}),
        ("WEBP", {"lossless": False}),
        ("WEBP", {"lossless": True}),
        ("WEBP", {"icc_profile": b"icc"}),  # a profile makes it the extended (VP8X) header
        ("TIFF", {}),  # a header not read here: the decoder refuses it
    ],
    ids=["png", "jpeg", "gif", "bmp", "webp", "webp-lossless", "webp-extended", "tiff"],
)
def test_each_format_is_held_to_the_limit(fmt: str, params: dict[str, object]) -> None:
    data = _encode(fmt, **params)
    assert tio.load_image(data, max_pixels=64 * 48).shape == (48, 64, 3)  # at the limit: ok
    with pytest.raises(tio.MediaError) as info:
        tio.load_image(data, max_pixels=64 * 48 - 1)
    assert info.value.source == f"<bytes: {len(data)}>"
    if fmt == "TIFF":
        assert "it may be over max_pixels=3,071" in info.value.reason
    else:
        assert "declares 64x48 = 3,072 pixels, over the limit max_pixels=3,071" in info.value.reason


def test_raising_the_limit_lets_a_large_image_through() -> None:
    """9500x9500 (90.25 million pixels) is over the default; 1 bit per pixel keeps the
    decode small (11 MB)."""
    data = _png(9500, 9500, bit_depth=1, color_type=0, rows=9500)
    with pytest.raises(tio.MediaError, match=LIMIT):
        tio.load_image(data, width=64, height=64)
    for limit in (9500 * 9500, None):
        out = tio.load_image(data, width=64, height=64, max_pixels=limit)
        assert out.shape == (64, 64, 3) and not out.any()


def test_video_frames_are_held_to_the_limit() -> None:
    clip = _clip()
    with pytest.raises(tio.MediaError, match="declares 64x48 = 3,072 pixels") as info:
        tio.load_video(clip, max_pixels=3071)
    assert info.value.source == f"<bytes: {len(clip)}>"
    with pytest.raises(tio.MediaError, match="max_pixels=3,071"):
        tio.demux_video(clip, max_pixels=3071)
    assert tio.load_video(clip, max_pixels=3072).shape == (16, 48, 64, 3)


def test_a_frame_larger_than_the_stream_declares_is_refused_by_the_decoder() -> None:
    """A raw H.264 stream that changes size mid-stream declares only its first size; the
    decoder itself holds the limit for the larger frames."""
    if "libx264" not in av.codecs_available:
        pytest.skip("needs libx264")
    stream = _clip("h264", frames=4) + _clip("h264", frames=4, size=(128, 96))
    assert tio.load_video(stream, width=32, height=24).shape == (8, 24, 32, 3)
    with pytest.raises(tio.MediaError, match="cannot decode") as info:
        tio.load_video(stream, width=32, height=24, max_pixels=64 * 48)
    assert info.value.source == f"<bytes: {len(stream)}>"


@pytest.mark.parametrize("bad", [0, -5, 2.5, "1000", True])
def test_a_bad_max_pixels_is_refused(bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="max_pixels must be"):
        tio.load_image(_encode("PNG"), max_pixels=bad)  # type: ignore[arg-type]


# -- malformed containers --------------------------------------------------------------------
def test_a_video_of_an_unknown_codec_raises_media_error() -> None:
    """A container naming a codec FFmpeg has no decoder for gives a stream without a codec
    context (it used to raise AttributeError)."""
    if "libx264" not in av.codecs_available:
        pytest.skip("needs libx264")
    clip = _clip().replace(b"avc1", b"zzzz")  # the sample entry's codec tag
    with pytest.raises(tio.MediaError, match="no decoder for the video stream's codec") as info:
        tio.load_video(clip)
    assert info.value.source == f"<bytes: {len(clip)}>"


def _variants(data: bytes, count: int, seed: int) -> list[bytes]:
    """``count`` copies of ``data``, each with 1 to 8 bytes set to random values."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        out.append(bytes(b))
    return out


@pytest.mark.parametrize(
    "fmt, codec", [("mp4", "libx264"), ("matroska", "mpeg4")], ids=["mp4-h264", "mkv-mpeg4"]
)
def test_byte_flipped_videos_load_or_raise_media_error(fmt: str, codec: str) -> None:
    """300 corrupted copies of a small clip: each loads or raises MediaError naming it."""
    outcomes = {"loaded": 0, "refused": 0}
    for data in _variants(_clip(fmt, codec), 300, seed=7):
        try:
            tio.load_video(data, width=32, height=24)
            outcomes["loaded"] += 1
        except tio.MediaError as e:
            assert e.source == f"<bytes: {len(data)}>"
            outcomes["refused"] += 1
    assert outcomes["loaded"] and outcomes["refused"]  # the variants exercise both
