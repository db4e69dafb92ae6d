"""Test data for the case: short tones written as WAV and FLAC with PyAV."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import av
import numpy as np

RATE = 8000


def _write(path: Path, codec: str, samples: np.ndarray) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=RATE, layout="mono")
        stream.format = "s16"
        for start in range(0, samples.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(samples[:, start : start + 1024]), format="s16", layout="mono"
            )
            frame.sample_rate = RATE
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    t = np.arange(RATE // 2) / RATE
    for i in range(6):
        tone = 0.5 * np.sin(2 * np.pi * (220 + 110 * i) * t)
        samples = (tone * 32767).astype(np.int16)[None, :]
        ext, codec = (".wav", "pcm_s16le") if i % 2 == 0 else (".flac", "flac")
        _write(root / f"{i:02d}_{i % 3}{ext}", codec, samples)
    return {"root": str(root)}
