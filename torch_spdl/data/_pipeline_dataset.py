"""``PipelineDataset``: a pipeline as a ``torch.utils.data.IterableDataset``.

It lets a ``torch.utils.data.DataLoader`` (or Lightning) drive a pipeline: every iteration
builds a fresh pipeline from the declaration, and when several consumers read the same
declaration (DataLoader worker processes, distributed ranks) each one reads a disjoint
shard of the source, so no item is seen twice.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sized
from typing import Any, Generic, TypeVar

import torch.utils.data

from ..pipeline import (
    BuildOptions,
    PipelineBuilder,
    PipelineSpec,
    StoppableSource,
    build_pipeline,
)
from ..pipeline.defs import PipeConfig
from ..source import DistributedRandomSampler, resolve_rank_and_world_size

__all__ = ["PipelineDataset"]

_LG = logging.getLogger(__name__)

T = TypeVar("T")

BuilderLike = PipelineBuilder[Any, Any] | Callable[[], PipelineBuilder[Any, Any]]

# Sources that already yield only this rank's share: they are split across workers only.
_RANK_SHARDED_SOURCES: tuple[type, ...] = (
    DistributedRandomSampler,
    torch.utils.data.distributed.DistributedSampler,
)


class _Shard:
    """Every ``step``-th item of ``source`` from position ``start`` (a sync source).

    A class rather than a bare ``islice`` so that a ``Pipeline`` used as the source is still
    stopped with the pipeline that reads it (the engine's ``stop_source`` hook), and so
    that a source error names the shard.
    """

    def __init__(self, source: Iterable[Any], start: int, step: int) -> None:
        self.source = source
        self.start = start
        self.step = step

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self.source, self.start, None, self.step)

    def stop_source(self) -> None:
        if isinstance(self.source, StoppableSource):
            self.source.stop_source()

    def __repr__(self) -> str:
        return f"shard {self.start} of {self.step} of {self.source!r}"


class _AsyncShard:
    """``_Shard`` for an async source (``islice`` takes sync iterables only)."""

    def __init__(self, source: AsyncIterable[Any], start: int, step: int) -> None:
        self.source = source
        self.start = start
        self.step = step

    async def _iterate(self) -> AsyncIterator[Any]:
        i = 0
        async for item in self.source:
            if i >= self.start and (i - self.start) % self.step == 0:
                yield item
            i += 1

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    def __repr__(self) -> str:
        return f"shard {self.start} of {self.step} of {self.source!r}"


class PipelineDataset(torch.utils.data.IterableDataset[T], Generic[T]):
    """Iterate a freshly built pipeline each time; shard it across workers and ranks.

    ``builder`` is a :class:`~torch_spdl.pipeline.PipelineBuilder`, or a zero-argument
    callable that returns one (called in the process that iterates, so the declaration
    need not be picklable and may open files there). The other build arguments go to
    :func:`~torch_spdl.pipeline.build_pipeline`. Breaking out of the iteration (or dropping
    the iterator) stops the pipeline and joins every thread.

    With ``shard=True`` (the default), inside a DataLoader worker process and/or across
    distributed ranks, the source is replaced by every ``num_shards``-th item from position
    ``shard``, with ``num_shards = world_size * num_workers`` and
    ``shard = worker_id * world_size + rank``: together the workers of a rank read exactly
    ``islice(source, rank, None, world_size)``, whatever the number of workers. Every
    consumer still iterates the whole source (skipping the other shards' items), so the
    source should be cheap: indices or paths, with the loading done in the stages. A
    :class:`~torch_spdl.source.DistributedRandomSampler` or torch ``DistributedSampler``
    source already yields one rank's share, so it is split across workers only.
    ``rank`` and ``world_size`` default to :func:`~torch_spdl.source.detect_rank_and_world_size`
    at iteration time. ``shard=False`` gives every consumer the whole source.

    ``len()`` is ``length`` when given; otherwise, when the source is ``Sized`` and every
    stage is a 1:1 ``pipe`` (a function or async function: no generator, ``aggregate`` or
    ``disaggregate``), it is the number of source items this rank reads, which assumes no
    op returns ``None`` or fails. Otherwise ``len()`` raises ``TypeError``, as torch does
    for an iterable dataset of unknown length.

    Args:
        builder: the pipeline's declaration, or a zero-argument callable returning it.
        length: what ``len()`` returns (default: worked out as above).
        shard: split the source across worker processes and ranks (default True).
        rank: this process's rank (default: detected at iteration time).
        world_size: the number of ranks (default: detected at iteration time).
        num_threads: the most worker threads of each sync stage (as in ``build``).
        max_failures: failed items the pipeline may drop before it fails (-1: no limit).
        report_stats_interval: log the stage table every that many seconds (> 0).
        queue_size: the capacity of the queues between stages (default: the engine's).
    """

    def __init__(
        self,
        builder: BuilderLike,
        *,
        length: int | None = None,
        shard: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        num_threads: int | None = None,
        max_failures: int = -1,
        report_stats_interval: float = -1,
        queue_size: int | None = None,
    ) -> None:
        if not isinstance(builder, PipelineBuilder) and not callable(builder):
            raise TypeError(
                f"builder must be a PipelineBuilder or a callable returning one, got {builder!r}"
            )
        if length is not None and (not isinstance(length, int) or length < 0):
            raise ValueError(f"length must be a non-negative int, got {length!r}")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size must be positive, got {world_size!r}")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"invalid rank {rank} for world_size {world_size}")
        self.builder = builder
        self.length = length
        self.shard = shard
        self.rank = rank
        self.world_size = world_size
        self.build_options = BuildOptions(
            num_threads=num_threads,
            max_failures=max_failures,
            report_stats_interval=report_stats_interval,
            queue_size=queue_size,
        )

    # -- helpers -------------------------------------------------------------------------
    def _get_config(self) -> PipelineSpec:
        builder = self.builder if isinstance(self.builder, PipelineBuilder) else self.builder()
        if not isinstance(builder, PipelineBuilder):
            raise TypeError(f"the builder factory returned {builder!r}, not a PipelineBuilder")
        return builder.get_config()

    def _rank_and_world_size(self) -> tuple[int, int]:
        return resolve_rank_and_world_size(self.rank, self.world_size)

    def _shard_of(self, source: Any) -> tuple[int, int]:
        """``(shard, num_shards)`` of the current process for ``source``."""
        if not self.shard:
            return 0, 1
        info = torch.utils.data.get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if isinstance(source, _RANK_SHARDED_SOURCES):
            return worker_id, num_workers
        rank, world = self._rank_and_world_size()
        return worker_id * world + rank, world * num_workers

    # -- the dataset protocol -----------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        config = self._get_config()
        shard, num_shards = self._shard_of(config.source)
        if num_shards > 1:
            source: Any = config.source
            if not isinstance(source, Iterable) and isinstance(source, AsyncIterable):
                source = _AsyncShard(source, shard, num_shards)
            else:
                source = _Shard(source, shard, num_shards)
            config = PipelineSpec(source, list(config.stages), config.buffer_size)
        _LG.debug("PipelineDataset: shard %d of %d", shard, num_shards)
        pipeline = build_pipeline(config, options=self.build_options)
        with pipeline.auto_stop():
            yield from pipeline

    def __len__(self) -> int:
        if self.length is not None:
            return self.length
        config = self._get_config()
        source = config.source
        if not isinstance(source, Sized):
            raise TypeError(
                f"{type(self).__name__} has no len(): its source {source!r} has no __len__ "
                "(pass length=...)"
            )
        for stage in config.stages:
            if not isinstance(stage, PipeConfig) or not stage.one_to_one:
                raise TypeError(
                    f"{type(self).__name__} has no len(): stage {stage.label()!r} does not "
                    "make one item per input (pass length=...)"
                )
        n = len(source)
        if not self.shard or isinstance(source, _RANK_SHARDED_SOURCES):
            return n
        rank, world = self._rank_and_world_size()
        return len(range(rank, n, world))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.builder!r})"
