"""Load random video clips through a pipeline with torch_spdl.io (PyAV / FFmpeg).

    .venv/bin/python examples/video_clips.py --quick

Writes a few short test videos with PyAV (MPEG-4 Part 2, or H.264 when asked), in which
frame ``k`` is a flat gray whose level encodes ``k`` (``level(k)``). A pipeline then draws
random clips (video, start time), decodes each window with ``torch_spdl.io.load_video`` on threads
(FFmpeg releases the GIL) resized to 64x64, batches the clips and stacks them into one
``uint8`` tensor ``(B, T, C, H, W)``. The example checks its own result: every clip has the
expected frame count and shape, and its gray levels are the frames it asked for. It exits
non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import torch

import torch_spdl.io as tio
from torch_spdl.pipeline import PipelineBuilder

FPS = 25
LEVEL_STEP = 12  # wide enough to survive the lossy codec and the YUV round trip
SIDE = 64


def level(k: int) -> int:
    """The gray level of frame ``k``: neighbouring frames differ by ``LEVEL_STEP``."""
    return 16 + LEVEL_STEP * (k % 16)


def write_video(path: Path, frames: int, codec: str, size: tuple[int, int] = (160, 120)) -> None:
    """Encode ``frames`` flat gray frames at ``FPS``; frame k has level ``level(k)``."""
    w, h = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.gop_size = FPS  # a key frame every second, so seeking has work to do
        stream.options = {"qscale": "2"} if codec == "mpeg4" else {"crf": "10"}
        for k in range(frames):
            img = np.full((h, w, 3), level(k), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def load_clip(item: tuple[Path, int, int]) -> tuple[torch.Tensor, int]:
    """Decode ``clip_frames`` frames from frame ``start``: (T, C, H, W) uint8, and ``start``."""
    path, start, clip_frames = item
    # The window is in seconds: [start, start + T) frames, with half a frame of margin so
    # that rounding of the timestamps cannot drop or add a frame.
    t0 = (start - 0.5) / FPS
    t1 = (start + clip_frames - 0.5) / FPS
    clip = tio.load_video(path, timestamp=(max(t0, 0.0), t1), width=SIDE, height=SIDE)
    return tio.to_torch(clip).permute(0, 3, 1, 2), start


def collate(clips: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, list[int]]:
    return torch.stack([c for c, _ in clips]), [s for _, s in clips]


def check_batch(batch: torch.Tensor, starts: list[int], clip_frames: int) -> list[str]:
    """What is wrong with a batch (empty when it is right)."""
    problems = []
    if batch.dtype != torch.uint8 or tuple(batch.shape[1:]) != (clip_frames, 3, SIDE, SIDE):
        problems.append(f"batch {tuple(batch.shape)} {batch.dtype}")
    levels = batch.float().mean(dim=(2, 3, 4))  # (B, T): the gray level of each frame
    for clip_levels, start in zip(levels, starts, strict=True):
        want = torch.tensor([float(level(k)) for k in range(start, start + clip_frames)])
        err = (clip_levels - want).abs().max().item()
        if err > LEVEL_STEP / 2:  # a wrong frame is off by at least LEVEL_STEP
            problems.append(f"clip from frame {start}: levels off by up to {err:.1f}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter videos")
    parser.add_argument("--codec", default="mpeg4", help="mpeg4 (default) or libx264")
    parser.add_argument("--clips", type=int, default=None, help="clips to load")
    args = parser.parse_args()
    if args.codec not in av.codecs_available:
        print(f"codec {args.codec!r} is not in this FFmpeg build", file=sys.stderr)
        return 2
    videos, frames, clips = (3, 75, 48) if args.quick else (8, 120, 400)
    clips = args.clips or clips
    clip_frames, batch_size = 8, 8

    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"video{i}.mp4" for i in range(videos)]
        for p in paths:
            write_video(p, frames, args.codec)
        rng = random.Random(0)
        items = [
            (rng.choice(paths), rng.randrange(0, frames - clip_frames), clip_frames)
            for _ in range(clips)
        ]
        pipeline = (
            PipelineBuilder()
            .add_source(items)
            .pipe(load_clip, concurrency=4, name="load_video")
            .aggregate(batch_size)
            .pipe(collate, name="collate")
            .add_sink(4)
            .build()
        )
        t0 = time.perf_counter()
        count, problems = 0, []
        for batch, starts in pipeline:
            problems += check_batch(batch, starts, clip_frames)
            count += len(starts)
        elapsed = time.perf_counter() - t0

    print(
        f"{videos} videos ({args.codec}, {frames} frames at {FPS} fps), {count} random clips "
        f"of {clip_frames} frames resized to {SIDE}x{SIDE}, batches of {batch_size}"
    )
    print(f"clips/s: {count / elapsed:.1f}  (frames/s: {count * clip_frames / elapsed:.0f})")
    if count != clips:
        problems.append(f"{count} clips came out, expected {clips}")
    for p in problems[:10]:
        print("FAILED:", p)
    if problems:
        return 1
    print("every clip has the right frames: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
