"""Applying a filter description to decoded frames: FFmpeg's filter graph, or a plain
``frame.reformat`` when the chain is only a scale and a pixel format conversion."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import av
from av.video.reformatter import VideoReformatter

from ._filter_desc import parse_args, parse_filter_desc

_LOCAL = threading.local()
_INTERPOLATION = {
    "fast_bilinear": "FAST_BILINEAR",
    "bilinear": "BILINEAR",
    "bicubic": "BICUBIC",
    "neighbor": "POINT",
    "area": "AREA",
    "lanczos": "LANCZOS",
}


@dataclass(frozen=True)
class Reformat:
    """A chain that ``frame.reformat`` can do alone (scale and/or pixel format)."""

    width: int | None
    height: int | None
    pix_fmt: str | None
    interpolation: str

    def size_for(self, src_w: int, src_h: int) -> tuple[int, int]:
        """Output size for an input of ``src_w`` x ``src_h`` (``-1``/``-2``: keep aspect)."""
        w, h = self.width, self.height
        if w is None and h is None:
            return src_w, src_h
        if w is None or w < 0:
            w = max(2, round(src_w * h / src_h / 2) * 2)  # type: ignore[operator]
        if h is None or h < 0:
            h = max(2, round(src_h * w / src_w / 2) * 2)
        return w, h

    def apply(self, frame: Any) -> Any:
        """Scale and convert one frame."""
        w, h = self.size_for(frame.width, frame.height)
        fmt = self.pix_fmt or frame.format.name
        if w == frame.width and h == frame.height and fmt == frame.format.name:
            return frame
        return _reformatter().reformat(
            frame, width=w, height=h, format=fmt, interpolation=self.interpolation, threads=1
        )


def _reformatter() -> VideoReformatter:
    """A reformatter per thread: it keeps its scaler (SwsContext) between frames of one
    geometry, which ``frame.reformat`` would rebuild for every new frame (~0.8 ms).

    Its scaler runs on the calling thread (``threads=1``): parallelism comes from decoding
    several images at once, and a scaler with threads of its own, kept in a thread-local,
    hangs a child forked from another thread (the child frees the other threads' locals,
    and freeing the scaler joins threads that do not exist in the child)."""
    fmt = getattr(_LOCAL, "reformatter", None)
    if fmt is None:
        fmt = _LOCAL.reformatter = VideoReformatter()
    return fmt


@functools.lru_cache(maxsize=64)  # parsed once per distinct chain, not once per image
def as_reformat(desc: str | None) -> Reformat | None:
    """Return a :class:`Reformat` when ``desc`` is only ``scale``/``format``, else None."""
    width = height = pix_fmt = None
    interpolation = "BILINEAR"
    for name, args in parse_filter_desc(desc):
        kv = parse_args(args)
        if name == "scale" and set(kv) <= {"w", "h", "flags"}:
            width = int(kv["w"]) if "w" in kv else None
            height = int(kv["h"]) if "h" in kv else None
            interpolation = _INTERPOLATION.get(kv.get("flags", "bilinear"), "")
            if not interpolation:
                return None
        elif name == "format" and set(kv) == {"pix_fmts"} and "|" not in kv["pix_fmts"]:
            pix_fmt = kv["pix_fmts"]
        else:
            return None
    return Reformat(width, height, pix_fmt, interpolation)


@functools.lru_cache(maxsize=64)
def target_size(desc: str | None) -> tuple[int, int] | None:
    """The explicit ``scale`` size in ``desc`` (both sides positive), if any."""
    for name, args in parse_filter_desc(desc):
        if name == "scale":
            kv = parse_args(args)
            try:
                w, h = int(kv.get("w", "-1")), int(kv.get("h", "-1"))
            except ValueError:
                return None
            return (w, h) if w > 0 and h > 0 else None
    return None


def _pull_all(graph: Any) -> Iterator[Any]:
    while True:
        try:
            yield graph.pull()
        except (av.error.BlockingIOError, av.error.EOFError):
            return


def filter_graph(frames: Iterable[Any], desc: str, media_type: str) -> Iterator[Any]:
    """Run ``frames`` through an FFmpeg filter graph built from the chain ``desc``."""
    graph = None
    for frame in frames:
        if graph is None:
            graph = av.filter.Graph()
            if media_type == "audio":
                src = graph.add_abuffer(
                    format=frame.format.name,
                    sample_rate=frame.sample_rate,
                    layout=frame.layout.name,
                    time_base=frame.time_base,
                )
                sink_name = "abuffersink"
            else:
                src = graph.add_buffer(
                    width=frame.width,
                    height=frame.height,
                    format=frame.format.name,
                    time_base=frame.time_base,
                )
                sink_name = "buffersink"
            nodes = [graph.add(name, args) for name, args in parse_filter_desc(desc)]
            graph.link_nodes(src, *nodes, graph.add(sink_name)).configure()
        graph.push(frame)
        yield from _pull_all(graph)
    if graph is not None:
        graph.push(None)
        yield from _pull_all(graph)
