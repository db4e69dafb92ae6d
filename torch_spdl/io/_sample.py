"""Sampled video decoding: the frames asked for, by index or by time, from one demux.

Why: a training step that wants 8 frames of a 10 s clip should not pay for 300. Decoding
every frame and picking (what ``load_video(indices=)`` did) costs about 4x the decoding
that the picked frames need, and scaling every frame costs as much again.

How, from the packets of one demux (:func:`~torch_spdl.io.demux_video`):

- **Frame numbers.** Frame ``i`` is the ``i``-th packet in presentation (pts) order, the
  order in which a full decode returns frames; packets the demuxer marks as discarded (an
  edit list's lead-in) are decoded as references but never counted, as a full decode does
  not return them either. Streams whose packets lack distinct timestamps fall back to a
  full decode of the window, then the pick.
- **Runs.** Each wanted frame is decoded from the last key frame at or before it (in
  decode order, with a timestamp not after it), unless the decoder is already positioned
  at or past that key frame: continuing then costs no more packets than restarting, so
  wanted frames of one GOP, or of neighbouring GOPs, share a run. A run feeds packets up
  to the last wanted one and then drains the decoder, so it never decodes the packets
  after a wanted frame that a B-frame decoder would otherwise wait for.
- **Skipped frames.** Packets whose frame is not wanted are decoded with
  ``skip_frame=NONREF``: frames that no other frame refers to are not decoded at all
  (exact by definition: nothing depends on them; in H.264 with B-frames about half of
  the frames between a key frame and a wanted frame).
- **One thread per clip.** The decoder runs on the calling thread (``threads=1``) with the
  GIL released, so parallelism comes from decoding several clips at once (a pipeline
  stage's concurrency) and the CPU per clip stays minimal; frame threads would add CPU for
  a clip decoded alone (``decoder_options={"threads": "0"}`` turns them on).
- **Only kept frames are scaled** (and only once each, when an index repeats).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from ._decode import configure_decoder, decode_packets
from ._demux import Packets
from ._errors import MediaError
from ._filter import as_reformat, filter_graph
from ._frames import ImageFrames, VideoFrames

_LG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Table:
    """The stream's frames in presentation order, as packet positions (decode order)."""

    order: list[int]  # frame number -> packet position
    times: list[float]  # frame number -> start time in seconds
    end: float  # when the last frame stops being shown
    keys: list[int]  # packet positions of key frames, ascending


def _table(packets: Packets) -> _Table | None:
    """The frame table, or None when the packets cannot number the frames (no or equal
    timestamps), and a full decode must."""
    pk = packets.packets
    tb = packets.stream.time_base
    if tb is None or any(p.pts is None for p in pk):
        return None
    shown = [i for i, p in enumerate(pk) if not p.is_discard]
    order = sorted(shown, key=lambda i: pk[i].pts)
    pts = [pk[i].pts for i in order]
    if len(set(pts)) != len(pts):
        return None
    num, den = tb.numerator, tb.denominator  # as PyAV's frame.time computes it
    times = [v * num / den for v in pts]
    if packets.window is not None:
        lo, hi = packets.window
        keep = [j for j, t in enumerate(times) if lo <= t < hi]
        order = [order[j] for j in keep]
        times = [times[j] for j in keep]
    if not order:
        return None
    last = pk[order[-1]]
    end = times[-1] + (last.duration * num / den if last.duration else 0.0)
    keys = [i for i, p in enumerate(pk) if p.is_keyframe]
    return _Table(order, times, end, keys)


def indices_at(table_times: Sequence[float], end: float, times: Sequence[float]) -> list[int]:
    """Frame numbers shown at ``times`` (seconds): the last frame starting at or before
    each time (the first frame for a time before it). Raises ``ValueError`` past ``end``."""
    out = []
    for t in times:
        if not (0 <= t <= end) or math.isnan(t):
            raise ValueError(f"time {t} s is outside the clip (0 to {end:.3f} s)")
        out.append(max(bisect.bisect_right(table_times, t) - 1, 0))
    return out


def count_frames(packets: Packets) -> int:
    """How many frames a full decode of ``packets`` returns (its window's, if it has one),
    counted from the packets without decoding."""
    table = _table(packets)
    if table is not None:
        return len(table.order)
    return sum(1 for p in packets.packets if not p.is_discard)


def draw_start(generator: Any, n: int) -> int:
    """A uniform draw from ``range(n)`` with the caller's generator: a
    ``numpy.random.Generator``, a ``torch.Generator``, an int seed, or None (a fresh
    generator seeded by the OS; never a global RNG)."""
    if hasattr(generator, "manual_seed"):  # a torch.Generator
        import torch

        return int(torch.randint(n, (), generator=generator))
    if generator is None or isinstance(generator, int):
        generator = np.random.default_rng(generator)
    if not isinstance(generator, np.random.Generator):
        raise TypeError(
            "generator must be a numpy.random.Generator, a torch.Generator, an int or None, "
            f"not {type(generator).__name__}"
        )
    return int(generator.integers(n))


def _check_indices(source: str, indices: Sequence[int], n: int) -> list[int]:
    bad = [i for i in indices if not -n <= i < n]
    if bad:
        raise MediaError(source, f"frame indices {bad} out of range (clip has {n})")
    return [i % n for i in indices]


def _key_before(table: _Table, packets: Packets, pos: int) -> int:
    """The packet position decoding must start at for the packet at ``pos``."""
    pk = packets.packets
    j = bisect.bisect_right(table.keys, pos) - 1
    while j >= 0 and pk[table.keys[j]].pts > pk[pos].pts:  # an open GOP's leading frame
        j -= 1
    if j < 0:
        return 0  # no key frame before it: decode from the start, as a full decode does
    return table.keys[j]


def _runs(table: _Table, packets: Packets, wanted: set[int]) -> list[tuple[int, int]]:
    """``(first, last)`` packet positions to feed, in decode order, covering ``wanted``."""
    runs: list[list[int]] = []
    for pos in sorted(wanted):
        key = _key_before(table, packets, pos)
        if runs and key <= runs[-1][1] + 1:
            runs[-1][1] = pos  # continuing costs no more packets than restarting
        else:
            runs.append([key, pos])
    return [(a, b) for a, b in runs]


def _decode_runs(
    packets: Packets, ctx: Any, runs: list[tuple[int, int]], wanted_pts: set[int]
) -> Iterator[Any]:
    """The decoded frames whose pts is wanted, run after run."""
    pk = packets.packets
    time_base = packets.stream.time_base
    skip = ""
    for n, (first, last) in enumerate(runs):
        if n:
            ctx.flush_buffers()
        for pos in range(first, last + 1):
            want = "DEFAULT" if pk[pos].pts in wanted_pts else "NONREF"
            if want != skip:
                ctx.skip_frame = skip = want
            for frame in ctx.decode(pk[pos]):
                if frame.pts in wanted_pts:
                    yield frame
        if skip != "DEFAULT":
            ctx.skip_frame = skip = "DEFAULT"
        for frame in ctx.decode(None):  # drain: the frames the decoder still holds back
            if frame.pts in wanted_pts:
                if frame.time_base is None:
                    frame.time_base = time_base
                yield frame


def _scaled(frames: list[Any], desc: str | None) -> list[Any]:
    if not desc:
        return frames
    reformat = as_reformat(desc)
    if reformat is not None:
        return [reformat.apply(f) for f in frames]
    return list(filter_graph(frames, desc, "video"))


def _by_full_decode(
    packets: Packets,
    indices: Sequence[int] | None,
    times: Sequence[float] | None,
    desc: str | None,
    options: dict[str, str] | None,
) -> list[ImageFrames]:
    """Decode the whole window, then pick (streams whose packets cannot number frames)."""
    frames = decode_packets(packets, filter_desc=desc, decoder_options=options)
    assert isinstance(frames, VideoFrames)
    if times is not None:
        starts = [float(f.time) if f.time is not None else math.nan for f in frames.frames]
        try:
            indices = indices_at(starts, math.inf, times)
        except ValueError as e:
            raise MediaError(packets.source, str(e)) from e
    assert indices is not None
    picked = _check_indices(packets.source, indices, len(frames.frames))
    return [ImageFrames(packets.source, [frames.frames[i]]) for i in picked]


def sample_decode_video(
    packets: Packets,
    indices: Sequence[int] | None = None,
    *,
    times: Sequence[float] | None = None,
    filter_desc: str | None = "format=pix_fmts=rgb24",
    decoder_options: dict[str, str] | None = None,
) -> list[ImageFrames]:
    """Decode only the frames at ``indices`` (or shown at ``times``) of ``packets``.

    Returns one :class:`ImageFrames` per index, in the order asked (an index may repeat),
    ready for :func:`convert_frames`. The frames are exactly those a full decode returns
    at those positions; only the key-frame-to-frame spans that hold them are decoded, and
    only the kept frames go through ``filter_desc``. Closes the packets' container.

    Args:
        packets: from :func:`demux_video` (with a ``timestamp`` window, frame numbers
            count from the window's first frame).
        indices: frame numbers in presentation order (negative ones count from the end).
        times: instead of ``indices``: seconds on the stream's clock; each picks the frame
            shown at that time (the last frame starting at or before it).
        filter_desc: the chain for the kept frames (:func:`get_video_filter_desc`).
        decoder_options: FFmpeg decoder options; the decoder runs on the calling thread
            unless ``threads`` is given.

    Raises:
        MediaError: naming the source, for an index or time out of range, and for a
            packet the decoder cannot decode.
    """
    if (indices is None) == (times is None):
        raise TypeError("give exactly one of indices= and times=")
    options = {"threads": "1", **(decoder_options or {})}
    try:
        table = _table(packets)
        if table is None:
            _LG.debug("%s: packets without distinct timestamps: full decode", packets.source)
            return _by_full_decode(packets, indices, times, filter_desc, options)
        if times is not None:
            try:
                indices = indices_at(table.times, table.end, times)
            except ValueError as e:
                raise MediaError(packets.source, str(e)) from e
        assert indices is not None
        picked = _check_indices(packets.source, indices, len(table.order))
        return _decode_picked(packets, table, picked, filter_desc, options)
    finally:
        packets.container.close()


def _decode_picked(
    packets: Packets,
    table: _Table,
    picked: list[int],
    desc: str | None,
    options: dict[str, str],
) -> list[ImageFrames]:
    pk = packets.packets
    wanted = {table.order[i] for i in picked}
    wanted_pts = {pk[pos].pts for pos in wanted}
    runs = _runs(table, packets, wanted)
    try:
        ctx = configure_decoder(packets, desc, options)
        got = {f.pts: f for f in _decode_runs(packets, ctx, runs, wanted_pts)}
    except (av.FFmpegError, ValueError, OSError) as e:
        raise MediaError(packets.source, f"cannot decode: {e}") from e
    missing = sorted(i for i in set(picked) if pk[table.order[i]].pts not in got)
    if missing:
        raise MediaError(
            packets.source,
            f"frames {missing} did not decode (the decoder dropped them: damaged packets?)",
        )
    unique = sorted(wanted_pts)
    try:
        scaled = dict(zip(unique, _scaled([got[p] for p in unique], desc), strict=True))
    except (av.FFmpegError, ValueError) as e:
        raise MediaError(packets.source, f"cannot convert: {e}") from e
    _LG.debug(
        "%s: %d frames from %d runs (%d packets)",
        packets.source,
        len(unique),
        len(runs),
        sum(b - a + 1 for a, b in runs),
    )
    return [ImageFrames(packets.source, [scaled[pk[table.order[i]].pts]]) for i in picked]
