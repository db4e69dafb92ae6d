"""torch_spdl.io: decoding against PIL, batching layout, zero-copy views, errors, GIL."""

from __future__ import annotations

import asyncio
import io
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from _sync import CHILD_S
from PIL import Image

import torch_spdl.io as tio
from torch_spdl.pipeline import PipelineBuilder, PipelineFailure


def _picture(h: int, w: int, seed: int = 0, noise: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y + seed * 37) % 256], -1)
    return np.clip(base + rng.integers(0, noise + 1, (h, w, 3)), 0, 255).astype(np.uint8)


def _encode(arr: np.ndarray, fmt: str, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, quality=quality)
    return buf.getvalue()


def _pil(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return _encode(_picture(375, 500), "JPEG")


@pytest.fixture(scope="module")
def png() -> bytes:
    return _encode(_picture(375, 500), "PNG")


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 s at 10 fps, 64x48, yuv420p; frame i is filled with the value 10 * i."""
    path = tmp_path_factory.mktemp("media") / "clip.mp4"
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(20):
            arr = np.full((48, 64, 3), 10 * i, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def _write_audio(path: Path, codec: str, rate: int = 16000, seconds: float = 1.0) -> Path:
    n = int(rate * seconds)
    t = np.arange(n) / rate
    tone = (0.5 * np.sin(2 * math.pi * 440 * t) * 32767).astype(np.int16)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate, layout="stereo")
        for start in range(0, n, 1024):
            chunk = tone[start : start + 1024]
            data = np.stack([chunk, chunk]).T.reshape(1, -1).copy()
            frame = av.AudioFrame.from_ndarray(data, format="s16", layout="stereo")
            frame.sample_rate = rate
            frame.pts = start
            frame.time_base = Fraction(1, rate)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


# -- pixels agree with PIL ------------------------------------------------------------------
def test_jpeg_matches_pil(jpeg: bytes) -> None:
    ours = tio.load_image(jpeg)
    assert ours.shape == (375, 500, 3) and ours.dtype == np.uint8
    assert np.abs(ours.astype(np.int16) - _pil(jpeg)).mean() < 2


def test_png_matches_pil_exactly(png: bytes, tmp_path: Path) -> None:
    np.testing.assert_array_equal(tio.load_image(png), _pil(png))
    path = tmp_path / "a.png"
    path.write_bytes(png)
    np.testing.assert_array_equal(tio.load_image(path), _pil(png))
    np.testing.assert_array_equal(tio.load_image(str(path)), _pil(png))


@pytest.mark.parametrize(
    "kind", ["baseline", "progressive", "gray", "1080p", "png", "png-gray", "png-rgba", "png-16"]
)
@pytest.mark.parametrize("size", [None, (224, 224), (100, -1)])
def test_direct_decode_equals_container_path(kind: str, size: object, tmp_path: Path) -> None:
    """decode_image feeds JPEG and PNG bytes straight to the decoder (no container, so a
    PNG is decoded once, not twice); the pixels must be those of the general demux ->
    decode -> filter path, from bytes and from a path."""
    picture = _picture(1080, 1920) if kind == "1080p" else _picture(375, 500)
    img = Image.fromarray(picture)
    mode = {"gray": "L", "png-gray": "L", "png-rgba": "RGBA", "png-16": "I;16"}.get(kind, "RGB")
    buf = io.BytesIO()
    (img.convert(mode) if mode != "RGB" else img).save(
        buf,
        "PNG" if kind.startswith("png") else "JPEG",
        quality=90,
        progressive=kind == "progressive",
    )
    data = buf.getvalue()
    w, h = size if isinstance(size, tuple) else (None, None)
    desc = tio.get_video_filter_desc(scale_width=w, scale_height=h)
    ref = tio.convert_frames([tio.decode_packets(tio.demux_image(data), filter_desc=desc)])[0]
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    for src in (data, path):
        np.testing.assert_array_equal(tio.load_image(src, width=w, height=h), ref)


def test_building_blocks_as_in_reference(jpeg: bytes) -> None:
    desc = tio.get_video_filter_desc(scale_width=224, scale_height=224)
    frames = tio.decode_packets(tio.demux_image(jpeg), filter_desc=desc)
    assert isinstance(frames, tio.ImageFrames)
    assert (frames.width, frames.height, frames.pix_fmt) == (224, 224, "rgb24")
    buffer = tio.convert_frames([frames, frames])
    tensor = tio.to_torch(buffer).permute(0, 3, 1, 2)
    assert tensor.shape == (2, 3, 224, 224) and tensor.dtype == torch.uint8


def test_resize_close_to_pil_resize(png: bytes) -> None:
    ours = tio.load_image(png, width=250, height=188).astype(np.int16)
    pil = np.asarray(Image.open(io.BytesIO(png)).resize((250, 188), Image.BILINEAR))
    assert np.abs(ours - pil).mean() < 3


def test_crop_and_pixel_formats(png: bytes) -> None:
    full = tio.load_image(png)
    crop = tio.load_image(png, crop_width=100, crop_height=50)
    np.testing.assert_array_equal(crop, full[162:212, 200:300])
    assert tio.load_image(png, pix_fmt="gray").shape == (375, 500, 1)
    assert tio.load_image(png, pix_fmt="rgba").shape == (375, 500, 4)
    bgr = tio.load_image(png, pix_fmt="bgr24")
    np.testing.assert_array_equal(bgr[..., ::-1], full)
    assert tio.load_image(png, width=100).shape == (76, 100, 3)  # aspect kept, even size


def test_filter_graph_path_matches_reformat(png: bytes) -> None:
    desc = tio.get_video_filter_desc(scale_width=120, scale_height=90, crop_width=100)
    frames = tio.decode_packets(tio.demux_image(png), filter_desc=desc)
    assert (frames.width, frames.height) == (100, 90)


def test_lowres_choice() -> None:
    assert tio.pick_lowres(1920, 1080, 224, 224) == 2
    assert tio.pick_lowres(500, 375, 224, 224) == 0
    assert tio.pick_lowres(4000, 3000, 224, 224) == 3
    assert tio.pick_lowres(1000, 1000, 300, 300) == 1


def test_lowres_decode_close_to_full(tmp_path: Path) -> None:
    data = _encode(_picture(1080, 1920, noise=0), "JPEG")
    ours = tio.load_image(data, width=224, height=224).astype(np.int16)
    ref = np.asarray(Image.open(io.BytesIO(data)).resize((224, 224), Image.BILINEAR))
    assert np.abs(ours - ref).mean() < 4


# -- batching -------------------------------------------------------------------------------
def test_batch_shape_dtype_layout(jpeg: bytes, png: bytes) -> None:
    big = _encode(_picture(720, 1280, seed=3), "JPEG")
    batch = tio.load_image_batch([jpeg, png, big], width=96, height=64)
    assert batch.shape == (3, 64, 96, 3) and batch.dtype == np.uint8
    assert batch.flags.c_contiguous
    one = tio.load_image(png, width=96, height=64)
    np.testing.assert_array_equal(batch[1], one)


def test_convert_frames_rejects_mixed_sizes(jpeg: bytes, png: bytes) -> None:
    a = tio.decode_image(jpeg, width=32, height=32)
    b = tio.decode_image(png, width=64, height=32)
    with pytest.raises(ValueError, match="differ"):
        tio.convert_frames([a, b])


def test_buffer_pool_reuses_a_batch_only_once_nothing_sees_it(jpeg: bytes, png: bytes) -> None:
    pool = tio.BufferPool(max_buffers=2)
    frames = [tio.decode_image(d, width=32, height=24) for d in (jpeg, png, jpeg)]
    first = tio.convert_frames(frames, pool=pool)
    np.testing.assert_array_equal(first, tio.convert_frames(frames))
    view = tio.to_torch(first).permute(0, 3, 1, 2)[1:]  # a tensor view keeps it in use
    addr = first.ctypes.data
    del first
    second = tio.convert_frames(frames, pool=pool)
    assert second.ctypes.data != addr and len(pool) == 2
    third = tio.convert_frames(frames, pool=pool)  # both in use: a plain allocation
    assert len(pool) == 2 and third.ctypes.data not in (addr, second.ctypes.data)
    del view
    again = tio.load_image_batch([jpeg, png, jpeg], width=32, height=24, pool=pool)
    assert again.ctypes.data == addr  # free again: reused
    np.testing.assert_array_equal(again, second)
    with pytest.raises(ValueError, match="max_buffers"):
        tio.BufferPool(0)


def test_buffer_pool_sees_views_of_views_and_tensors() -> None:
    pool = tio.BufferPool(max_buffers=1)
    a = pool.take((4, 6), np.uint8)
    assert a is not None
    view = a[1:][:, ::2].T  # a view of a view of a view
    del a
    assert pool.take((4, 6), np.uint8) is None  # still seen through the view: in use
    tensor = tio.to_torch(view)
    del view
    assert pool.take((4, 6), np.uint8) is None  # the tensor still sees it
    del tensor
    assert pool.take((4, 6), np.uint8) is not None  # nothing does: free again
    assert len(pool) == 1


def test_to_torch_shares_memory(jpeg: bytes) -> None:
    buffer = tio.load_image_batch([jpeg, jpeg], width=32, height=32)
    tensor = tio.to_torch(buffer)
    assert tensor.data_ptr() == buffer.ctypes.data
    tensor[0, 0, 0, 0] = 7
    buffer[1, 2, 3, 1] = 9
    assert buffer[0, 0, 0, 0] == 7 and tensor[1, 2, 3, 1] == 9
    assert tio.to_torch(tensor) is tensor


def test_async_load_image_batch(jpeg: bytes) -> None:
    out = asyncio.run(tio.async_load_image_batch([jpeg] * 3, width=16, height=16))
    assert out.shape == (3, 16, 16, 3)
    cfg = tio.cuda_config(device_index=0)
    on_gpu = asyncio.run(tio.async_load_image_batch([jpeg], width=16, height=16, cuda_config=cfg))
    assert isinstance(on_gpu, torch.Tensor) and on_gpu.shape == (1, 16, 16, 3)
    assert on_gpu.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


# -- video and audio ------------------------------------------------------------------------
def test_video_whole_and_time_range(video: Path) -> None:
    clip = tio.load_video(video)
    assert clip.shape == (20, 48, 64, 3) and clip.dtype == np.uint8
    means = clip.reshape(20, -1).mean(1)
    np.testing.assert_allclose(means, np.arange(20) * 10, atol=6)
    part = tio.load_video(video, timestamp=(0.5, 1.0), width=32, height=24)
    assert part.shape == (5, 24, 32, 3)
    np.testing.assert_allclose(part.reshape(5, -1).mean(1), np.arange(5, 10) * 10, atol=6)


def test_video_frame_indices(video: Path) -> None:
    clip = tio.load_video(video.read_bytes(), indices=[0, 5, 19])
    np.testing.assert_allclose(clip.reshape(3, -1).mean(1), [0, 50, 190], atol=6)
    with pytest.raises(tio.MediaError, match="out of range"):
        tio.load_video(video, indices=[25])


@pytest.mark.parametrize("codec,suffix", [("pcm_s16le", "wav"), ("flac", "flac")])
def test_audio_resampled_float32(tmp_path: Path, codec: str, suffix: str) -> None:
    path = _write_audio(tmp_path / f"a.{suffix}", codec)
    wav = tio.load_audio(path)
    assert wav.dtype == np.float32 and wav.shape[1] == 2
    assert abs(wav.shape[0] - 16000) <= 1024
    assert 0.45 < np.abs(wav).max() < 0.55
    mono = tio.load_audio(path.read_bytes(), sample_rate=8000, num_channels=1)
    assert mono.shape[1] == 1 and abs(mono.shape[0] - 8000) <= 600
    assert mono.flags.c_contiguous


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [b"", b"this is not an image at all", "truncated_jpeg", "truncated_png", "corrupt_jpeg"],
)
def test_bad_bytes_raise_media_error(data: object, jpeg: bytes, png: bytes) -> None:
    if data == "truncated_jpeg":
        data = jpeg[: len(jpeg) // 2]
    elif data == "truncated_png":
        data = png[: len(png) // 2]
    elif data == "corrupt_jpeg":
        raw = bytearray(jpeg)
        raw[600:4000] = bytes(3400)
        data = bytes(raw)
    assert isinstance(data, bytes)
    with pytest.raises(tio.MediaError) as info:
        tio.load_image(data)
    assert info.value.source == f"<bytes: {len(data)}>"
    assert info.value.source in str(info.value)


def test_bad_path_raises_media_error_naming_it(tmp_path: Path) -> None:
    text = tmp_path / "notes.jpg"
    text.write_text("hello")
    for path in (text, tmp_path / "missing.jpg"):
        with pytest.raises(tio.MediaError, match="notes.jpg|missing.jpg") as info:
            tio.load_image(path)
        assert info.value.source == str(path)
    with pytest.raises(tio.MediaError, match="no audio stream"):
        tio.load_audio(_encode(_picture(8, 8), "PNG"))


def test_batch_strict_and_lenient(jpeg: bytes) -> None:
    with pytest.raises(tio.MediaError):
        tio.load_image_batch([jpeg, b"junk"], width=8, height=8)
    out = tio.load_image_batch([jpeg, b"junk", jpeg], width=8, height=8, strict=False)
    assert out.shape == (2, 8, 8, 3)
    with pytest.raises(tio.MediaError, match="batch"):
        tio.load_image_batch([b"junk"], width=8, height=8, strict=False)


def test_bad_samples_skipped_and_counted_in_pipeline(jpeg: bytes) -> None:
    items = [jpeg, b"junk", jpeg, jpeg[:100], jpeg, b"", jpeg]

    def decode(data: bytes) -> tio.ImageFrames:
        return tio.decode_image(data, width=32, height=32)

    def build(max_failures: int):  # noqa: ANN202
        return (
            PipelineBuilder()
            .add_source(items)
            .pipe(decode, concurrency=2, output_order="input")
            .aggregate(8)
            .pipe(tio.convert_frames)
            .pipe(tio.to_torch)
            .pipe(tio.transfer_tensor)
            .add_sink(4)
            .build(max_failures=max_failures)
        )

    pipeline = build(3)
    batches = list(pipeline)
    assert len(batches) == 1 and batches[0].shape == (4, 32, 32, 3)
    assert sum(s.num_failed for s in pipeline.get_stats()) == 3
    with pytest.raises(PipelineFailure):
        list(build(2))


# -- transfer -------------------------------------------------------------------------------
def test_transfer_without_cuda_returns_cpu_tensor() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    t = torch.arange(6)
    assert tio.transfer_tensor(t) is t
    batch = {"x": t, "y": [t]}
    assert tio.transfer_tensor(batch) is batch
    assert asyncio.run(tio.async_transfer_tensor(t)) is t


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_transfer_to_cuda_on_dedicated_stream() -> None:
    t = torch.arange(1 << 20, dtype=torch.float32)
    out = tio.transfer_tensor({"x": t, "y": (t, 3)})
    assert out["x"].is_cuda and out["y"][1] == 3
    assert torch.equal(out["x"].cpu(), t)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()

    def in_thread(_: int) -> bool:
        # Each thread's copy is whole when it returns, and the thread's current stream is
        # left as it was (the copy ran on a stream of the transfer's own).
        out = tio.transfer_tensor(t)
        return torch.equal(out.cpu(), t) and torch.cuda.current_stream() == (
            torch.cuda.default_stream()
        )

    with ThreadPoolExecutor(2) as ex:
        assert all(ex.map(in_thread, range(4)))


# -- fork safety ----------------------------------------------------------------------------
_FORK_AFTER_DECODE = """
import concurrent.futures as cf, multiprocessing as mp, sys
import torch_spdl.io as tio
tio.load_image(sys.stdin.buffer.read(), width=224, height=224)  # this thread keeps a scaler
def in_other_thread():
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
        return list(ex.map(abs, [-1, -2, -3]))
print(cf.ThreadPoolExecutor(1).submit(in_other_thread).result())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_forking_from_another_thread_after_decoding_does_not_hang(jpeg: bytes) -> None:
    """A child forked by a worker thread frees the other threads' thread-locals; the cached
    scaler must not own threads of its own then (it did: the child hung in its free)."""
    run = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_DECODE],
        input=jpeg,
        capture_output=True,
        timeout=CHILD_S,
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert run.stdout.decode().strip() == "[1, 2, 3]"


# -- the GIL --------------------------------------------------------------------------------
def _steps_of_another_thread_during(call: Callable[[], object], times: int) -> int:
    """How many steps a spinning thread makes while ``call`` runs, ``times`` times.

    The interpreter's switch interval is made huge, so a thread that holds the GIL is
    never made to hand it over: the spinner can step during ``call`` only if ``call``
    releases the GIL. No clock is read; a GIL-holding ``call`` gives exactly 0."""
    steps, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            steps[0] += 1
            time.sleep(0)  # hands the GIL back between steps (never inside `call`)

    interval = sys.getswitchinterval()
    spinner = threading.Thread(target=spin)
    sys.setswitchinterval(1000.0)
    try:
        spinner.start()
        during = 0
        for _ in range(times):
            before = steps[0]
            call()
            during += steps[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        spinner.join()
    return during


def test_decoding_releases_the_gil() -> None:
    data = _encode(_picture(1080, 1920, seed=1, noise=24), "JPEG")

    def decode() -> None:
        tio.decode_packets(tio.demux_image(data))

    def hold() -> None:  # pure Python of about the same length: holds the GIL
        sum(i * i for i in range(200_000))

    assert _steps_of_another_thread_during(hold, 5) == 0  # the measure itself
    assert _steps_of_another_thread_during(decode, 20) > 0
