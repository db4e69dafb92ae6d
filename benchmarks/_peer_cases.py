"""What each contender of the peers benchmark runs, one timed section per run.

Each workload has one function per contender, written as that project's users would write
it with its best settings, and :func:`case` is the entry a fresh process calls
(``_cases.peer_case``). Every contender imports its libraries before the clock starts
(:data:`PRELOAD`), and video contenders decode one clip first, so the timed section holds
the work, not a first import.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _cpu_meter import CpuMeter
from _peer_plan import BATCH, DEEP, SAMPLED, SIDE, installed, sampled_indices
from engine import anoop, asleep_10ms, noop, sleep_10ms  # engine.py's stage ops


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
