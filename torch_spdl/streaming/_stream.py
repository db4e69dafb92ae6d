"""The stages that turn shard URLs into samples, as a ``PipelineBuilder``, and the decode
step that follows the shuffle buffer.

    shard tasks ──► locate (async) ──► read chunks (async) ──► split tar ──► raw samples
                    first range,        ranged reads,          samples,
                    size if larger      concurrency N          in order

Every stage keeps its input order, so one consumer's sample sequence depends only on
its shard list: that is what makes a seeded shuffle repeatable and a resume exact. The
first ranged read of a shard is also its size probe: a shard smaller than ``chunk_size``
costs one request, as a plain GET would; a larger one is then read as ranged chunks. How
many reads run ahead of the splitter is :mod:`._readahead`'s call: one while the store
keeps up with the consumer, more (up to ``read_concurrency``, across shards and chunks)
when the splitter finds its next chunk still being read, so memory stays near
``(read_concurrency + 2) * chunk_size`` at most however large the shards are, and near
two chunks where the consumer is the slower side.

The samples leave this pipeline *undecoded* (their fields as ``bytes``): the shuffle
buffer (:mod:`._progress`) holds them so, and :class:`DecodeAndTransform` runs on each
sample the buffer lets out, on decode threads. A buffer of 1,000 JPEGs then costs their encoded
size (tens of KiB each), not 1,000 decoded images (147 KiB each at 224x224).

Failures are data here, not exceptions, so that the consumer can hold each shard to its
failure budget: a tar that breaks off and a sample that does not decode come out as
:class:`Failed` items, and every shard that was read to its end ends with a
:class:`ShardEnd`. A read that fails after its retries fails the pipeline with the URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..pipeline import PipelineBuilder
from ._cache import CacheFill, CacheLease, ShardCache
from ._decode import Decoder
from ._readahead import ReadAhead
from ._retry import ShardReadError
from ._store import Store, protocol_of
from ._tar import TarFormatError, TarSplitter

__all__ = [
    "Chunk",
    "DecodeAndTransform",
    "Failed",
    "Sample",
    "ShardEnd",
    "ShardTask",
    "stream_builder",
]


@dataclass(frozen=True)
class ShardTask:
    """Read ``url`` from byte ``start`` to ``end`` (None: its end): a piece of the epoch
    (``pos`` in the consumer's list; samples numbered from ``first_index``), or, with
    ``refill``, a run of samples a restored state names (no :class:`ShardEnd` follows)."""

    pos: int
    url: str
    start: int = 0
    first_index: int = 0
    end: int | None = None
    refill: bool = False


@dataclass
class Chunk:
    """Bytes ``[offset, end)`` of a task's object (``data`` None: not read yet; from
    ``lease``, the local copy, when it has one)."""

    task: ShardTask
    offset: int
    end: int
    data: bytes | None
    last: bool
    lease: CacheLease | None = None


@dataclass
class Sample:
    """Sample ``index`` of shard ``pos``: its fields (raw, then decoded) and its span."""

    pos: int
    index: int
    url: str
    key: str
    start: int
    end: int
    value: Any


@dataclass
class Failed:
    """A sample (``index``; -1: the rest of the shard) that could not be split or decoded;
    ``end`` is the byte after it (-1 when unknown)."""

    pos: int
    index: int
    url: str
    key: str | None
    error: BaseException
    end: int = -1


@dataclass
class ShardEnd:
    """Shard ``pos`` has been read to its end (or to where it broke off)."""

    pos: int
    url: str


class _Locate:
    """First ranged read of a task; when it came back full, the size, and the chunk plan.
    With a cache, a shard is read from its local copy, made first if there is none. Each
    task's first read is a unit of the read-ahead gate (:mod:`._readahead`)."""

    def __init__(
        self, store: Store, chunk_size: int, cache: ShardCache | None, gate: ReadAhead
    ) -> None:
        self.store = store
        self.chunk_size = chunk_size
        self.cache = cache
        self.gate = gate

    async def __call__(self, task: ShardTask) -> list[Chunk]:
        async with self.gate.unit(self.gate.key(task, task.start)):
            if self.cache is not None and protocol_of(task.url) != "file":
                return await self._cached(task, self.cache)
            return await self._remote(task)

    async def _remote(self, task: ShardTask) -> list[Chunk]:
        store, size = self.store, self.chunk_size
        stop = task.start + size if task.end is None else min(task.end, task.start + size)
        data = await store.read(task.url, task.start, stop)
        if len(data) < stop - task.start or stop == task.end:
            return [Chunk(task, task.start, task.start + len(data), data, True)]
        total = task.end if task.end is not None else await store.size(task.url)
        chunks = [Chunk(task, task.start, stop, data, stop >= total)]
        for offset in range(stop, total, size):
            end = min(total, offset + size)
            chunks.append(Chunk(task, offset, end, None, end >= total))
        return chunks

    async def _cached(self, task: ShardTask, cache: ShardCache) -> list[Chunk]:
        """The task's chunks from the local copy, the first one read: a valid copy (the
        object's size and ETag unchanged), or one downloaded now when the task reads the
        whole shard; a task of part of a shard without a valid copy reads the object
        (``_remote``)."""
        total, tag = await self.store.info(task.url)
        whole = task.start == 0 and task.end is None and not task.refill
        entry = await asyncio.to_thread(cache.open, task.url, total, tag, whole)
        if entry is None:
            return await self._remote(task)
        if isinstance(entry, CacheFill):
            try:
                await self._download(entry, task.url, total)
                lease = await asyncio.to_thread(entry.finish, total, tag)
            except BaseException:
                entry.abort()
                raise
        else:
            lease = entry
        stop = lease.size if task.end is None else min(task.end, lease.size)
        step = self.chunk_size
        chunks = [
            Chunk(task, offset, min(stop, offset + step), None, offset + step >= stop, lease)
            for offset in range(task.start, stop, step)
        ]
        if not chunks:
            lease.release()
            return [Chunk(task, task.start, task.start, b"", True)]
        lease.chunks = len(chunks)
        first = chunks[0]
        try:
            first.data = await asyncio.to_thread(lease.read, first.offset, first.end)
        finally:
            lease.chunk_read()
        return chunks

    async def _download(self, fill: CacheFill, url: str, total: int) -> None:
        for offset in range(0, total, self.chunk_size):
            end = min(total, offset + self.chunk_size)
            data = await self.store.read(url, offset, end)
            await asyncio.to_thread(fill.write, offset, data)
            if len(data) < end - offset:
                return  # shorter than its size: changed meanwhile (the copy is not kept)


class _Read:
    """A planned chunk's bytes (chunks read by ``_Locate`` pass through), each read a
    unit of the read-ahead gate."""

    def __init__(self, store: Store, gate: ReadAhead) -> None:
        self.store = store
        self.gate = gate

    async def __call__(self, chunk: Chunk) -> Chunk:
        if chunk.data is not None:
            return chunk
        async with self.gate.unit(self.gate.key(chunk.task, chunk.offset)):
            return await self._read(chunk)

    async def _read(self, chunk: Chunk) -> Chunk:
        if chunk.lease is not None:
            lease = chunk.lease
            try:
                chunk.data = await asyncio.to_thread(lease.read, chunk.offset, chunk.end)
            finally:
                lease.chunk_read()
        if chunk.data is None:
            data = await self.store.read(chunk.task.url, chunk.offset, chunk.end)
            if len(data) != chunk.end - chunk.offset:
                raise ShardReadError(
                    chunk.task.url,
                    f"bytes {chunk.offset}-{chunk.end - 1}",
                    1,
                    EOFError(f"got {len(data)} bytes: the object is shorter than its size"),
                )
            chunk.data = data
        return chunk


class _Split:
    """Chunks of each task, in order, into samples (one task at a time: concurrency 1);
    it tells the read-ahead gate what it took and when it wants the next chunk."""

    def __init__(self, gate: ReadAhead) -> None:
        self._gate = gate
        self._task: ShardTask | None = None
        self._splitter = TarSplitter()
        self._index = 0
        self._broken = False

    def __call__(self, chunk: Chunk) -> Iterator[Sample | Failed | ShardEnd]:
        self._gate.taken(chunk.task, chunk.offset)
        yield from self._split(chunk)
        self._gate.idle()

    def _split(self, chunk: Chunk) -> Iterator[Sample | Failed | ShardEnd]:
        task = chunk.task
        if task is not self._task:
            self._task, self._splitter = task, TarSplitter(task.start)
            self._index, self._broken = task.first_index, False
        if self._broken:
            return
        assert chunk.data is not None
        error: TarFormatError | None = None
        try:
            raws = self._splitter.feed(chunk.data)
        except TarFormatError as exc:
            raws, error = exc.completed, exc
        if error is None and (chunk.last or self._splitter.ended):
            try:
                raws += self._splitter.finish()
            except TarFormatError as exc:
                error = exc
        yield from self._samples(task, raws)
        if error is not None:  # the samples before the fault went out; the rest is lost
            self._broken = True
            error.add_note(f"in shard {task.url}")
            yield Failed(task.pos, -1, task.url, None, error)
            if not task.refill:
                yield ShardEnd(task.pos, task.url)
            return
        if chunk.last and not task.refill:
            self._broken = True  # whatever follows the end of the archive is not read
            yield ShardEnd(task.pos, task.url)

    def _samples(self, task: ShardTask, raws: list[Any]) -> Iterator[Sample]:
        for raw in raws:
            index, self._index = self._index, self._index + 1
            yield Sample(task.pos, index, task.url, raw.key, raw.start, raw.end, raw.fields)


class DecodeAndTransform:
    """A sample's fields decoded, with ``__key__`` and ``__url__``, then ``transform``
    (thread-safe: it runs on the decode threads, after the shuffle buffer). A sample
    that fails becomes a :class:`Failed`."""

    def __init__(self, decoder: Decoder, transform: Callable[[dict[str, Any]], Any] | None):
        self.decoder = decoder
        self.transform = transform

    def __call__(self, item: Sample) -> Sample | Failed:
        try:
            value: Any = self.decoder(item.value)
            value["__key__"] = item.key
            value["__url__"] = item.url
            if self.transform is not None:
                value = self.transform(value)
        except Exception as exc:
            exc.add_note(
                f"sample {item.key!r} of shard {item.url} (bytes {item.start}-{item.end - 1})"
            )
            return Failed(item.pos, item.index, item.url, item.key, exc, item.end)
        item.value = value
        return item


Concurrency = int | Literal["auto"]
_AUTO_MOST = 64  # the widest the read-ahead opens when the read stages' concurrency is tuned


def stream_builder(
    tasks: Sequence[Any],
    store: Store,
    *,
    read_concurrency: Concurrency,
    chunk_size: int,
    cache: ShardCache | None = None,
) -> PipelineBuilder[Any, Any]:
    """The pipeline of one consumer, up to raw (undecoded) samples in shard order (no
    sink); ``cache``: the local copies to read from and fill."""
    tasks = list(tasks)
    most = read_concurrency if isinstance(read_concurrency, int) else _AUTO_MOST
    gate = ReadAhead(tasks, most)
    return (
        PipelineBuilder()
        .add_source(tasks)
        .pipe(
            _Locate(store, chunk_size, cache, gate),
            concurrency=read_concurrency,
            name="locate",
            output_order="input",
            queue_size=4,
            max_failures=0,
        )
        .disaggregate()
        .pipe(
            _Read(store, gate),
            concurrency=read_concurrency,
            name="read",
            output_order="input",
            queue_size=4,
            max_failures=0,
        )
        .pipe(_Split(gate), name="split", queue_size=4, max_failures=0)
    )
