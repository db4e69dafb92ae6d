"""The autotuning benchmark's workloads: the stage ops and the pipelines they make.

Each workload is a pipeline of one or two stages with the fixed concurrencies to sweep and
the CPU budget the tuner gets, so the benchmark can build the same pipeline at a fixed
level or with ``concurrency="auto"`` (``autotune.py`` says what it measures). The ops wait
(5 ms, sync or async), decode JPEGs with PIL (which releases the GIL), or wait for a
latency that part 2 changes mid-run through :data:`latency`, a dict so that the change
reaches the running stage.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch_spdl.pipeline import AutotuneConfig, PipelineBuilder

DEFAULT_CPU_BUDGET = AutotuneConfig().cpu_budget


SINK = 16
latency = {"s": 0.004}  # the I/O stage of the two-stage pipeline; part 2 changes it


# -- ops -------------------------------------------------------------------------------
def sleep_sync(x: int) -> int:
    time.sleep(0.005)
    return x


async def sleep_async(x: int) -> int:
    await asyncio.sleep(0.005)
    return x


def io_wait(x: int) -> int:
    time.sleep(latency["s"])
    return x


class Decoder:
    """PIL decodes one of a few JPEGs (written to a temp dir, read once into memory)."""

    def __init__(self, count: int = 16, side: int = 192) -> None:
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(0)
        self.blobs: list[bytes] = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(count):
                path = os.path.join(tmp, f"{i}.jpg")
                pixels = (rng.random((side, side, 3)) * 255).astype("uint8")
                Image.fromarray(pixels).save(path, quality=90)
                with open(path, "rb") as f:
                    self.blobs.append(f.read())

    def __call__(self, x: int) -> int:
        from PIL import Image

        with Image.open(io.BytesIO(self.blobs[x % len(self.blobs)])) as im:
            im.load()  # the decoder releases the GIL
        return x


# -- workloads ---------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    stages: list[tuple[Callable[[Any], Any], str]]  # op, stage name
    levels: list[tuple[int, ...]]  # fixed concurrencies to sweep, one per stage
    budget: float | None  # None: the default

    def builder(self, source: Iterable[int], conc: tuple[int, ...] | str) -> PipelineBuilder:
        b = PipelineBuilder().add_source(source)
        for i, (op, name) in enumerate(self.stages):
            b.pipe(op, concurrency=conc if isinstance(conc, str) else conc[i], name=name)
        return b.add_sink(SINK)

    def build(self, builder: PipelineBuilder) -> Any:
        kw = {} if self.budget is None else {"cpu_budget": self.budget}
        return builder.build(num_threads=64, **kw)

    @property
    def budget_value(self) -> float:
        return DEFAULT_CPU_BUDGET if self.budget is None else self.budget


def workloads() -> list[Workload]:
    decode = Decoder()
    return [
        Workload(
            "sync stage sleeping 5 ms",
            [(sleep_sync, "sleep")],
            [(c,) for c in (8, 16, 32, 48, 64)],
            None,
        ),
        Workload(
            "async stage sleeping 5 ms",
            [(sleep_async, "sleep")],
            [(c,) for c in (32, 64, 128, 160, 192, 224, 256)],
            None,
        ),
        Workload("PIL decode", [(decode, "decode")], [(c,) for c in (1, 2, 3, 4)], 1.0),
        Workload(
            "I/O 4 ms then PIL decode",
            [(io_wait, "io"), (decode, "decode")],
            list(itertools.product((4, 8, 16, 32), (1, 2, 3))),
            1.0,
        ),
    ]
