"""torch_spdl.io's sampled video decoding against a full PyAV decode of the same file.

Every clip is made here with PyAV (64x48 H.264, noise frames so that no two frames are
alike): B-frames, variable frame rate, a raw stream without timestamps, corrupt packets.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_spdl.io as tio

pytestmark = pytest.mark.skipif("libx264" not in av.codecs_available, reason="needs libx264")

N = 60  # frames in the test clips
GOP = 12


def _write(fmt: str = "mp4", n: int = N, bframes: int = 3, vfr: bool = False) -> bytes:
    """``n`` noise frames of 64x48, a key frame every ``GOP`` frames; with ``vfr``, frame
    durations of 20, 40 or 70 ms in a 1 ms time base."""
    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.gop_size = GOP
        stream.codec_context.options = {
            "bf": str(bframes),
            "keyint_min": str(GOP),
            "sc_threshold": "0",
        }
        if vfr:
            stream.codec_context.time_base = Fraction(1, 1000)
        t = 0
        for _ in range(n):
            pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            if vfr:
                frame.pts, frame.time_base = t, Fraction(1, 1000)
                t += int(rng.choice([20, 40, 70]))
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def _full(data: bytes) -> tuple[list[np.ndarray], list[float]]:
    """Every frame of a plain PyAV decode (rgb24), and its time."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(container.streams.video[0]))
    return [f.to_ndarray(format="rgb24") for f in frames], [float(f.time or 0.0) for f in frames]


@pytest.fixture(scope="module")
def bframes() -> bytes:
    return _write(bframes=3)


@pytest.fixture(scope="module")
def bframes_full(bframes: bytes) -> list[np.ndarray]:
    return _full(bframes)[0]


def _same(got: np.ndarray, want: list[np.ndarray], indices: list[int]) -> None:
    assert got.shape == (len(indices), 48, 64, 3)
    for k, i in enumerate(indices):
        np.testing.assert_array_equal(got[k], want[i], err_msg=f"frame {i}")


def test_the_clip_has_b_frames(bframes: bytes) -> None:
    with av.open(io.BytesIO(bframes)) as container:
        pts = [p.pts for p in container.demux(container.streams.video[0]) if p.size]
    assert pts != sorted(pts)  # decode order differs from presentation order


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(-N, N - 1), min_size=1, max_size=10))
def test_sampled_frames_equal_a_full_decode(
    bframes: bytes, bframes_full: list[np.ndarray], indices: list[int]
) -> None:
    """Any indices (repeated, unordered, negative, in one GOP or many)."""
    _same(tio.load_video(bframes, indices=indices), bframes_full, [i % N for i in indices])


@pytest.mark.parametrize("fmt", ["mp4", "matroska"])
@pytest.mark.parametrize("bf", [0, 3])
def test_evenly_spaced_and_consecutive(fmt: str, bf: int) -> None:
    data = _write(fmt, bframes=bf)
    full = _full(data)[0]
    for indices in ([0, 8, 17, 25, 34, 42, 51, 59], list(range(20, 36)), [59], [11, 12]):
        _same(tio.load_video(data, indices=indices), full, indices)


def test_building_block_and_scaling(bframes: bytes) -> None:
    desc = tio.get_video_filter_desc(scale_width=32, scale_height=24)
    frames = tio.sample_decode_video(tio.demux_video(bframes), [5, 40], filter_desc=desc)
    assert [len(f) for f in frames] == [1, 1]
    batch = tio.convert_frames(frames)
    whole = tio.load_video(bframes, width=32, height=24)
    np.testing.assert_array_equal(batch, whole[[5, 40]])
    with pytest.raises(TypeError, match="exactly one"):
        tio.sample_decode_video(tio.demux_video(bframes))


def test_variable_frame_rate_by_index_and_time() -> None:
    data = _write(vfr=True)
    full, times = _full(data)
    assert len(set(np.round(np.diff(times), 3))) > 1  # the frame rate does vary
    _same(tio.load_video(data, indices=[3, 30, 31, 58]), full, [3, 30, 31, 58])
    # the frame shown at t: the last one that starts at or before t
    asked = [0.0, times[10], times[10] + 0.001, times[41] - 0.001, times[-1]]
    shown = [max(i for i, s in enumerate(times) if s <= t) for t in asked]
    _same(tio.load_video(data, times=asked), full, shown)
    for bad in ([-1.0], [times[-1] + 5]):
        with pytest.raises(tio.MediaError, match="outside the clip") as info:
            tio.load_video(data, times=bad)
        assert info.value.source == f"<bytes: {len(data)}>"


def test_window_and_indices_count_from_the_window(bframes: bytes) -> None:
    window = tio.load_video(bframes, timestamp=(0.5, 1.5))
    picked = tio.load_video(bframes, timestamp=(0.5, 1.5), indices=[0, 7, -1])
    np.testing.assert_array_equal(picked, window[[0, 7, -1]])


def test_stream_without_timestamps_falls_back_to_a_full_decode() -> None:
    data = _write("h264", n=30)
    full = _full(data)[0]
    _same(tio.load_video(data, indices=[0, 13, 29]), full, [0, 13, 29])


def test_out_of_range_index_names_the_source(bframes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "clip.mp4"
    path.write_bytes(bframes)
    with pytest.raises(tio.MediaError, match="out of range") as info:
        tio.load_video(path, indices=[3, N])
    assert info.value.source == str(path)


def test_a_corrupt_packet_raises_media_error_only_where_it_is_needed(
    bframes: bytes, bframes_full: list[np.ndarray], tmp_path: Path
) -> None:
    """The key frame of the third GOP is garbage: its frames fail, the others decode."""
    with av.open(io.BytesIO(bframes)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
        key = [p for p in packets if p.is_keyframe][2]
        pos, size = key.pos, key.size
    raw = bytearray(bframes)
    raw[pos + 4 : pos + size] = np.random.default_rng(1).bytes(size - 4)
    path = tmp_path / "corrupt.mp4"
    path.write_bytes(raw)
    with pytest.raises(tio.MediaError, match="cannot decode|did not decode") as info:
        tio.load_video(path, indices=[1, 2 * GOP + 3])
    assert info.value.source == str(path)
    _same(tio.load_video(path, indices=[1, GOP + 5, 4 * GOP]), bframes_full, [1, 17, 48])


def test_random_clip_repeatable_with_a_generator(
    bframes: bytes, bframes_full: list[np.ndarray]
) -> None:
    a = tio.load_video_clip(bframes, 8, stride=2, generator=np.random.default_rng(3))
    b = tio.load_video_clip(bframes, 8, stride=2, generator=3)
    np.testing.assert_array_equal(a, b)
    start = int(np.random.default_rng(3).integers(N - 14))  # starts 0..N-15
    _same(a, bframes_full, list(range(start, start + 16, 2)))
    g = torch.Generator().manual_seed(5)
    start = int(torch.randint(N - 9, (), generator=torch.Generator().manual_seed(5)))
    _same(
        tio.load_video_clip(bframes, 10, generator=g), bframes_full, list(range(start, start + 10))
    )


def test_random_clip_leaves_the_global_rngs_alone(bframes: bytes) -> None:
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state()
    tio.load_video_clip(bframes, 4)
    tio.load_video_clip(bframes, 4, generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_clip_shorter_than_asked_pads_or_raises() -> None:
    data = _write(n=10)
    full = _full(data)[0]
    padded = tio.load_video_clip(data, 16, generator=0, width=64, height=48)
    _same(padded, full, [*range(10), *[9] * 6])
    with pytest.raises(tio.MediaError, match="10 frames, fewer than the clip's 16"):
        tio.load_video_clip(data, 16, short="error")
    with pytest.raises(ValueError, match="short"):
        tio.load_video_clip(data, 4, short="loop")
