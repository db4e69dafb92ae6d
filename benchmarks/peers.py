"""Side by side with the peers: torch_spdl against SPDL, torchdata and plain PyAV/torchvision.

    pip install -e '.[peers]'                 # spdl==0.8.0, torchdata==0.11.0
    .venv/bin/python benchmarks/peers.py --quick        # CI-sized, about 2 minutes
    .venv/bin/python benchmarks/peers.py                # 5 rounds, about 10 minutes on 2 cores
    .venv/bin/python benchmarks/peers.py --only video   # one workload

Workloads (each contender run in a fresh process, contenders alternated round by round,
medians with the min-max spread, CPU per item of the process tree and its peak PSS; see
``_measure.py``):

- ``video``: 20 H.264 clips (320x240, 10 s, 30 fps, GOP 30, x264's default B-frames),
  8 evenly spaced frames of each resized to 112x112, clips one after another on one thread:
  ``torch_spdl.io.load_video(indices=)`` (sampled decoding), the same call as it was
  before (every frame decoded and scaled, then picked: ``decode_packets`` + pick),
  ``spdl.io.sample_decode_video``, and a plain PyAV loop that seeks before each frame.
- ``jpeg``: 2,000 photo-like 500x375 JPEG files -> 224x224 batches of 32, decoding on 2
  threads: a torch_spdl pipeline with ``torch_spdl.io`` (``benchmarks/image_decode.py``'s
  epoch), the same engine with torchvision's ``decode_jpeg`` + ``resize`` as a user would
  write it (torch's default intra-op threads, and ``torch.set_num_threads(1)``), SPDL's
  pipeline with ``spdl.io``, and torchdata's ``ParallelMapper`` with PIL.
- ``engine``: 3 no-op stages over 200k ints, sync (concurrency 4) and async:
  torch_spdl (``benchmarks/engine.py``'s cases), torchdata ``ParallelMapper`` (4 threads
  per stage) with ``prebatch`` None, 16, 64 and 256, and SPDL.
- ``io``: one stage that waits 10 ms per item, concurrency 32 (limit: 3,200 items/s).

A peer that is not installed is skipped, and the table says so. The table ends with the
issue's targets, each marked met or not met on the medians.

**spdl_io's FFmpeg.** ``spdl.io`` (SPDL's native decoder, ``spdl_io``) loads FFmpeg's
shared libraries at run time: ``libavutil``, ``libavcodec``, ``libavformat``,
``libavdevice`` and ``libavfilter`` of FFmpeg 4 to 8 (sonames ``libavutil.so.56`` to
``.60``, ``libavcodec.so.58`` to ``.62``, ``libavformat.so.58`` to ``.62``,
``libavdevice.so.58`` to ``.62``, ``libavfilter.so.7`` to ``.11``), found through the
loader's path (``apt install ffmpeg`` or ``libavformat-dev libavdevice-dev
libavfilter-dev`` on Debian/Ubuntu). When they are not there, this script points spdl_io at
the FFmpeg 8 libraries inside PyAV's wheel (``av.libs``): links under their sonames in a
temporary folder, on ``LD_LIBRARY_PATH`` of the benchmark's own forkserver. Both decoders
then run the same FFmpeg build, which makes the video comparison like for like.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _measure import CpuMeter, Result, Spec  # noqa: E402
from engine import anoop, asleep_10ms, noop, sleep_10ms  # noqa: E402  (engine.py's stage ops)

GROUP = "peers"
CLIP = dict(width=320, height=240, seconds=10, fps=30, gop=30)
SAMPLED = 8  # frames per clip
SIDE = 112
BATCH = 32
# Our deep-queue rows: at queue_size=1024 and add_sink(1024) the 3 stages hold 4,110 items
# in flight with the consumer stopped, torchdata's prebatch=256 holds 6,400 (counted with
# an infinite source), so these compare at no more memory than torchdata's best.
DEEP = 1024

# workload -> (contender, peer module it needs or "", description)
CONTENDERS: dict[str, list[tuple[str, str, str]]] = {
    "video": [
        ("torch_spdl", "", "torch_spdl.io.load_video(indices=), sampled"),
        ("torch_spdl before", "", "decode every frame, scale, pick (the old load_video)"),
        ("spdl", "spdl", "spdl.io.demux_video + sample_decode_video"),
        ("pyav seek", "", "plain PyAV: seek to each frame's key frame, decode to it"),
    ],
    "jpeg": [
        ("torch_spdl", "", "pipeline + torch_spdl.io.decode_image"),
        ("torch_spdl + torchvision", "", "same engine, decode_jpeg + resize (default threads)"),
        ("torch_spdl + torchvision, 1 thread", "", "same, torch.set_num_threads(1)"),
        ("spdl", "spdl", "SPDL pipeline + spdl.io"),
        ("torchdata + PIL", "torchdata", "ParallelMapper(threads) + PIL"),
    ],
    "engine": [
        ("torch_spdl sync", "", "3 sync stages, concurrency 4"),
        ("torch_spdl async", "", "3 async stages"),
        ("torch_spdl sync, queue_size=1024", "", f"the same, {DEEP} items a queue and sink"),
        ("torch_spdl async, queue_size=1024", "", f"the same, {DEEP} items a queue and sink"),
        ("spdl sync", "spdl", "3 sync stages, concurrency 4"),
        ("spdl async", "spdl", "3 async stages"),
        *[
            (f"torchdata prebatch={p}", "torchdata", "3 ParallelMappers, 4 threads")
            for p in ("None", "16", "64", "256")
        ],
    ],
    "io": [
        ("torch_spdl sync", "", "sleep 10 ms, 32 threads"),
        ("torch_spdl async", "", "asyncio.sleep 10 ms, concurrency 32"),
        ("spdl sync", "spdl", "sleep 10 ms, concurrency 32"),
        ("spdl async", "spdl", "asyncio.sleep 10 ms, concurrency 32"),
        ("torchdata", "torchdata", "ParallelMapper(num_workers=32, threads)"),
    ],
}
UNITS = {"video": "clips", "jpeg": "images", "engine": "items", "io": "items"}


def installed(module: str) -> bool:
    return not module or importlib.util.find_spec(module) is not None


# -- data -----------------------------------------------------------------------------------


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


def sampled_indices() -> list[int]:
    n = CLIP["seconds"] * CLIP["fps"]
    return [round(k * (n - 1) / (SAMPLED - 1)) for k in range(SAMPLED)]


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


# -- video ----------------------------------------------------------------------------------


def _video_torch_spdl(path: str) -> Any:
    import torch_spdl.io as tio

    return tio.load_video(path, indices=sampled_indices(), width=SIDE, height=SIDE)


def _video_torch_spdl_before(path: str) -> Any:
    import torch_spdl.io as tio

    desc = tio.get_video_filter_desc(scale_width=SIDE, scale_height=SIDE)
    frames = tio.decode_packets(tio.demux_video(path), filter_desc=desc)
    return tio.convert_frames(
        tio.VideoFrames(frames.source, [frames.frames[i] for i in sampled_indices()])
    )


def _video_spdl(path: str) -> Any:
    import numpy as np
    import spdl.io

    desc = spdl.io.get_video_filter_desc(scale_width=SIDE, scale_height=SIDE)
    frames = spdl.io.sample_decode_video(
        spdl.io.demux_video(path), sampled_indices(), filter_desc=desc
    )
    return np.asarray(spdl.io.convert_frames(frames))


def _video_pyav_seek(path: str) -> Any:
    import av
    import numpy as np

    out = []
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for i in sampled_indices():
            pts = int(i / stream.average_rate / stream.time_base)
            container.seek(pts, stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts >= pts:
                    out.append(frame.to_ndarray(width=SIDE, height=SIDE, format="rgb24"))
                    break
    return np.stack(out)


VIDEO: dict[str, Callable[[str], Any]] = {
    "torch_spdl": _video_torch_spdl,
    "torch_spdl before": _video_torch_spdl_before,
    "spdl": _video_spdl,
    "pyav seek": _video_pyav_seek,
}


def video(contender: str, clips: str) -> dict[str, Any]:
    paths = sorted(str(p) for p in Path(clips).glob("*.mp4"))
    fn = VIDEO[contender]
    fn(paths[0])  # load the libraries, warm the code paths
    return _timed(lambda: sum(1 for p in paths if fn(p).shape == (SAMPLED, SIDE, SIDE, 3)))


# -- jpeg -----------------------------------------------------------------------------------


def _jpeg_torchvision(paths: list[Path]) -> int:
    import torch
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms.v2.functional import resize

    from torch_spdl.pipeline import PipelineBuilder

    def decode(p: Path) -> torch.Tensor:
        return resize(decode_jpeg(read_file(str(p))), [224, 224], antialias=True)

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .pipe(decode, concurrency=2, output_order="input")
        .aggregate(BATCH)
        .pipe(torch.stack)
        .add_sink(4)
        .build()
    )
    return sum(len(b) for b in pipeline)


def _jpeg_spdl(paths: list[Path]) -> int:
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    desc = spdl.io.get_video_filter_desc(scale_width=224, scale_height=224)

    def decode(p: Path) -> Any:
        return spdl.io.decode_packets(spdl.io.demux_image(str(p)), filter_desc=desc)

    def collate(frames: list[Any]) -> Any:
        return spdl.io.to_torch(spdl.io.convert_frames(frames))

    pipeline = (
        PipelineBuilder()
        .add_source(paths)
        .pipe(decode, concurrency=2, output_order="input")
        .aggregate(BATCH)
        .pipe(collate)
        .add_sink(4)
        .build(num_threads=4)
    )
    with pipeline.auto_stop():
        return sum(len(b) for b in pipeline.get_iterator(timeout=600))


def _jpeg_torchdata(paths: list[Path]) -> int:
    import numpy as np
    import torch
    from PIL import Image
    from torchdata import nodes

    def load(p: Path) -> np.ndarray:
        with Image.open(p) as img:
            return np.asarray(img.convert("RGB").resize((224, 224), Image.BILINEAR))

    def collate(items: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(items))

    node = nodes.ParallelMapper(nodes.IterableWrapper(paths), load, num_workers=2)
    loader = nodes.Loader(nodes.Mapper(nodes.Batcher(node, BATCH, drop_last=False), collate))
    return sum(len(b) for b in loader)


def jpeg(contender: str, jpegs: str) -> dict[str, Any]:
    import image_decode
    import torch

    paths = sorted(Path(jpegs).rglob("*.jpg"))
    if contender == "torch_spdl":
        return _timed(lambda: image_decode.spdl_epoch(paths, BATCH)[0])
    if contender.startswith("torch_spdl + torchvision"):
        if contender.endswith("1 thread"):
            torch.set_num_threads(1)  # this benchmark process only: its best setting
        return _timed(lambda: _jpeg_torchvision(paths))
    if contender == "spdl":
        return _timed(lambda: _jpeg_spdl(paths))
    return _timed(lambda: _jpeg_torchdata(paths))


# -- engine and I/O -------------------------------------------------------------------------


def _spdl_run(n: int, fn: Callable[..., Any], stages: int, concurrency: int) -> int:
    from spdl.pipeline import PipelineBuilder

    b = PipelineBuilder().add_source(range(n))
    for _ in range(stages):
        b.pipe(fn, concurrency=concurrency)
    pipeline = b.add_sink(64).build(num_threads=max(concurrency, 4))
    with pipeline.auto_stop():
        return sum(1 for _ in pipeline.get_iterator(timeout=600))


def _torch_spdl_run(
    n: int, fn: Callable[..., Any], stages: int, concurrency: int, deep: bool = False
) -> int:
    from torch_spdl.pipeline import PipelineBuilder

    b = PipelineBuilder().add_source(range(n))
    for _ in range(stages):
        b.pipe(fn, concurrency=concurrency)
    if deep:
        pipeline = b.add_sink(DEEP).build(queue_size=DEEP)
    else:
        pipeline = b.add_sink(64).build()  # engine.py's sink for tiny items
    with pipeline.auto_stop():
        return sum(1 for _ in pipeline)


def _torchdata_run(n: int, fn: Callable[..., Any], stages: int, workers: int, pre: str) -> int:
    from torchdata import nodes

    node: Any = nodes.IterableWrapper(range(n))
    prebatch = None if pre == "None" else int(pre)
    for _ in range(stages):
        node = nodes.ParallelMapper(node, fn, num_workers=workers, prebatch=prebatch)
    return sum(1 for _ in nodes.Loader(node))


def engine_or_io(workload: str, contender: str, n: int) -> dict[str, Any]:
    stages, conc = (3, 4) if workload == "engine" else (1, 32)
    is_async = "async" in contender
    fn: Callable[..., Any]
    if workload == "engine":
        fn = anoop if is_async else noop
    else:
        fn = asleep_10ms if is_async else sleep_10ms
    if contender.startswith("torch_spdl"):
        if is_async and workload == "engine":
            conc = 1  # engine.py's async case: one coroutine at a time per stage
        deep = contender.endswith(f"queue_size={DEEP}")
        return _timed(lambda: _torch_spdl_run(n, fn, stages, conc, deep))
    if contender.startswith("spdl"):
        if is_async and workload == "engine":
            conc = 1
        return _timed(lambda: _spdl_run(n, fn, stages, conc))
    pre = contender.split("=", 1)[1] if "=" in contender else "None"
    return _timed(lambda: _torchdata_run(n, fn, stages, conc, pre))


# -- measuring ------------------------------------------------------------------------------


def _timed(run: Callable[[], int]) -> dict[str, Any]:
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    count = run()
    seconds = time.perf_counter() - t0
    meter.stop()
    return {"samples": count, "seconds": seconds, "first_batch_s": None, "cpu_s": meter.cpu_s}


# imported before any clock starts, by every contender alike (torchvision's transforms
# and the peers take 0.1-0.5 s to import: inside the timed section that would be most of a
# quick run)
PRELOAD = ["torchvision.io", "torchvision.transforms.v2.functional", "spdl.io", "spdl.pipeline"]
PRELOAD += ["torchdata.nodes", "PIL.Image"]


def case(workload: str, contender: str, **kwargs: Any) -> dict[str, Any]:
    """One run of one contender (``_cases.peer_case`` calls this in a fresh process)."""
    for module in PRELOAD:
        if installed(module.split(".")[0]):
            importlib.import_module(module)
    if workload == "video":
        return video(contender, kwargs["clips"])
    if workload == "jpeg":
        return jpeg(contender, kwargs["jpegs"])
    return engine_or_io(workload, contender, kwargs["n"])


def plan(quick: bool, data: dict[str, Any], only: str = "") -> tuple[list[Spec], list[str]]:
    """The runs, and a line for each contender skipped because its peer is not installed."""
    specs, skipped = [], []
    sizes = {"engine": 40_000 if quick else 200_000, "io": 1_280 if quick else 6_400}
    for workload, contenders in CONTENDERS.items():
        if only and only != workload:
            continue
        for name, module, _ in contenders:
            if not installed(module):
                skipped.append(f"{workload}: {name} skipped ({module} is not installed)")
                continue
            kw: dict[str, Any] = {"workload": workload, "contender": name}
            if workload in ("engine", "io"):
                kw["n"] = sizes[workload]
            else:
                kw.update(data)
            specs.append(
                Spec(GROUP, name, 0, "peer_case", tuple(sorted(kw.items())), label=workload)
            )
    return specs, skipped


# -- tables ---------------------------------------------------------------------------------


def _of(results: list[Result], workload: str) -> dict[str, Result]:
    return {
        r.spec.impl: r
        for r in results
        if r.spec.group == GROUP and r.spec.label == workload and r.runs
    }


def _med(r: Result | None, fn: Callable[[Any], float]) -> float:
    return statistics.median(fn(s) for s in r.runs) if r is not None and r.runs else float("nan")


def _rate(r: Result | None) -> float:
    return _med(r, lambda s: s.rate)


def _cpu_ms(r: Result | None) -> float:
    return _med(r, lambda s: 1000 * s.cpu_s / s.samples if s.samples else math.nan)


def _spread(values: list[float], digits: int) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _best(rs: dict[str, Result], prefix: str) -> tuple[str, Result | None]:
    found = [(k, r) for k, r in rs.items() if k.startswith(prefix)]
    if not found:
        return "", None
    return max(found, key=lambda kr: _rate(kr[1]))


def targets(results: list[Result]) -> list[tuple[str, str, str]]:
    """The issue's targets: (target, measured, verdict on the medians)."""
    out: list[tuple[str, str, str]] = []

    def ratio(what: str, ours: Result | None, peer: Result | None, need: float) -> None:
        if ours is None or peer is None:
            out.append((what, "not measured", "-"))
            return
        x = _rate(ours) / _rate(peer)
        out.append((what, f"{x:.2f}x", "met" if x >= need else "not met"))

    v = _of(results, "video")
    ours = v.get("torch_spdl")
    for peer in ("spdl", "pyav seek"):
        ratio(f"video: clips/s >= 1.2x {peer}", ours, v.get(peer), 1.2)
        if ours is not None and peer in v:
            a, b = _cpu_ms(ours), _cpu_ms(v[peer])
            verdict = "met" if a < b else "not met"
            out.append((f"video: CPU per clip < {peer}", f"{a:.0f} vs {b:.0f} ms", verdict))
    j = _of(results, "jpeg")
    name, tv = _best(j, "torch_spdl + torchvision")
    ratio(
        f"jpeg: >= 1.1x same engine + torchvision (best: {name or '-'})",
        j.get("torch_spdl"),
        tv,
        1.1,
    )
    e = _of(results, "engine")
    pre, td = _best(e, "torchdata")
    for mode in ("sync", "async"):
        ratio(
            f"engine {mode}: >= 1.2x torchdata (best: {pre or '-'})",
            e.get(f"torch_spdl {mode}"),
            td,
            1.2,
        )
        ratio(
            f"engine {mode}, queue_size={DEEP} (fewer items in flight): >= 1.2x torchdata",
            e.get(f"torch_spdl {mode}, queue_size={DEEP}"),
            td,
            1.2,
        )
    o = _of(results, "io")
    for mode in ("sync", "async"):
        r = o.get(f"torch_spdl {mode}")
        if r is None:
            out.append((f"io {mode}: >= 95% of the 3,200/s limit", "not measured", "-"))
            continue
        share = _rate(r) / 3200
        verdict = "met" if share >= 0.95 else "not met"
        out.append((f"io {mode}: >= 95% of the 3,200/s limit", f"{share:.0%}", verdict))
    return out


def tables(results: list[Result], skipped: list[str] | None = None) -> list[str]:
    """Markdown: one table per workload, then the targets."""
    lines: list[str] = []
    for workload, contenders in CONTENDERS.items():
        rs = _of(results, workload)
        failed = [
            r for r in results if r.spec.group == GROUP and r.spec.label == workload and r.error
        ]
        if not rs and not failed:
            continue
        unit = UNITS[workload]
        lines += [
            f"**{workload}**",
            "",
            f"| contender | what | {unit}/s | CPU ms per {unit[:-1]} | peak PSS, MiB |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for name, _, what in contenders:
            r = rs.get(name)
            if r is None:
                continue
            rates = [s.rate for s in r.runs]
            cpu = [1000 * s.cpu_s / s.samples if s.samples else math.nan for s in r.runs]
            peak = r.peaks()
            lines.append(
                f"| {name} | {what} | {_spread(rates, 1 if workload == 'video' else 0)} | "
                f"{_spread(cpu, 3 if workload in ('engine', 'io') else 1)} | {_spread(peak, 0)} |"
            )
        lines += [f"| {r.spec.impl} | failed: {r.error} | | | |" for r in failed]
        lines.append("")
    lines += [f"- {s}" for s in skipped or []]
    lines += ["", "| target | measured (medians) | verdict |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(results)]
    return lines


def plot(path: Path, results: list[Result]) -> bool:
    """Throughput of every contender, relative to the best peer of its workload."""
    import matplotlib.pyplot as plt

    workloads = [w for w in CONTENDERS if _of(results, w)]
    if not workloads:
        return False
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        rs = _of(results, w)
        names = [n for n, _, _ in CONTENDERS[w] if n in rs]
        meds = [_rate(rs[n]) for n in names]
        lo = [m - min(s.rate for s in rs[n].runs) for m, n in zip(meds, names, strict=True)]
        hi = [max(s.rate for s in rs[n].runs) - m for m, n in zip(meds, names, strict=True)]
        colors = ["#2b6cb0" if n.startswith("torch_spdl") else "#d9822b" for n in names]
        ax.barh(range(len(names)), meds, xerr=[lo, hi], color=colors, capsize=2)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{UNITS[w]}/s (median, min-max)", fontsize=8)
        ax.set_title(w, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- running --------------------------------------------------------------------------------


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


def main(argv: list[str] | None = None) -> int:
    from _measure import machine, measure_all

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized runs (3 rounds)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (3 quick, 5 full)")
    parser.add_argument("--only", default="", choices=["", *CONTENDERS], help="one workload")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    info = machine()
    print(", ".join(f"{k}: {v}" for k, v in info.items()))
    with tempfile.TemporaryDirectory(prefix="torch_spdl_peers_") as tmp:
        data, notes = prepare(Path(tmp), args.quick)
        specs, skipped = plan(args.quick, data, args.only)
        results = measure_all(specs, repeats, desc="peer runs", fresh_memory=not args.quick)
    raw = [
        [r.spec.label, r.spec.impl, [vars(s) for s in (*r.memory_runs, *r.runs)], r.error]
        for r in results
    ]
    print("raw:", json.dumps(raw), flush=True)  # the figures, whatever the tables make of them
    print(f"\n{'quick' if args.quick else 'full'} mode, median (min-max) of {repeats} rounds")
    for note in notes:
        print(f"- {note}")
    print("\n".join(tables(results, skipped)))
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        plot(args.plot, results)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
