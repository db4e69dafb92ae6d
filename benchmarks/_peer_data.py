"""The peers benchmark's data: H.264 clips and a JPEG folder made on the spot, and an FFmpeg
that SPDL's decoder can load.

No data set is downloaded: the clips are a camera panning over a textured picture with
some noise (so the encoder has real motion and detail to code), the JPEGs
``image_decode.py``'s photo-like folder. Where the machine has no FFmpeg shared libraries,
:func:`spdl_io_libraries` points ``spdl_io`` at the ones inside PyAV's wheel (``peers.py``
says why that keeps the video comparison like for like).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from _peer_plan import CLIP, installed


def write_clip(path: Path, seed: int) -> None:
    """A 320x240 H.264 clip: a camera panning over a textured picture, with some noise."""
    import av
    import numpy as np

    rng = np.random.default_rng(seed)
    w, h, fps = CLIP["width"], CLIP["height"], CLIP["fps"]
    n = CLIP["seconds"] * fps
    y, x = np.mgrid[0 : h + 64, 0 : w + 2 * n].astype(np.float32)
    fx, fy = rng.uniform(0.02, 0.08, 2)
    canvas = np.stack(
        [
            128 + 100 * np.sin(x * fx),
            128 + 100 * np.cos(y * fy + x * 0.01),
            ((x // 23 + y // 19) % 2) * 200 + 20,
        ],
        -1,
    )
    canvas = np.clip(canvas + rng.normal(0, 8, canvas.shape), 0, 255).astype(np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.gop_size = CLIP["gop"]
        stream.codec_context.options = {
            "preset": "veryfast",
            "keyint_min": str(CLIP["gop"]),
            "sc_threshold": "0",
        }
        for i in range(n):
            dy = int(32 + 30 * np.sin(i / 40))
            pixels = np.ascontiguousarray(canvas[dy : dy + h, 2 * i : 2 * i + w])
            out.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        out.mux(stream.encode(None))


def make_data(root: Path, quick: bool) -> dict[str, Any]:
    """Video clips and a folder of JPEGs under ``root``; what the cases need to find them."""
    import image_decode

    clips = root / "clips"
    clips.mkdir()
    n_clips = 6 if quick else 20
    for k in range(n_clips):
        write_clip(clips / f"{k:02d}.mp4", seed=k)
    jpegs = root / "jpegs"
    n_jpegs = 400 if quick else 2000
    image_decode.write_photo_folder(jpegs, n_jpegs)
    return {"clips": str(clips), "jpegs": str(jpegs)}


def spdl_io_libraries(tmp: Path) -> str | None:
    """Make spdl_io loadable: None when it loads as it is; else a folder of links to PyAV's
    FFmpeg under the sonames spdl_io asks for (put on ``LD_LIBRARY_PATH`` before the
    forkserver starts), or None when there is nothing to link."""
    import subprocess

    # spdl.io imports its native module lazily: reading one of its functions loads it
    probe = "from spdl.io.lib import _libspdl; _libspdl.make_demuxer"
    env = dict(os.environ)
    if subprocess.run([sys.executable, "-c", probe], capture_output=True, env=env).returncode == 0:
        return None
    import av

    libs = Path(av.__file__).resolve().parent.parent / "av.libs"
    if not libs.is_dir():
        return None
    folder = tmp / "ffmpeg"
    folder.mkdir()
    for lib in libs.iterdir():
        stem, _, rest = lib.name.partition("-")
        if stem.startswith(("libav", "libsw")) and ".so." in rest:
            major = rest.split(".so.")[1].split(".")[0]
            (folder / f"{stem}.so.{major}").symlink_to(lib)
    paths = [str(folder), str(libs), *filter(None, [env.get("LD_LIBRARY_PATH")])]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
    if subprocess.run([sys.executable, "-c", probe], capture_output=True, env=env).returncode:
        return None
    return env["LD_LIBRARY_PATH"]


def prepare(tmp: Path, quick: bool) -> tuple[dict[str, Any], list[str]]:
    """Data for the cases, and notes (how spdl_io found FFmpeg, or why spdl is skipped)."""
    notes = []
    if installed("spdl"):
        path = spdl_io_libraries(tmp)
        if path is not None:
            os.environ["LD_LIBRARY_PATH"] = path  # this benchmark's own forkserver inherits it
            notes.append("spdl_io: FFmpeg 8 from PyAV's wheel (av.libs), linked under its sonames")
    return make_data(tmp, quick), notes
