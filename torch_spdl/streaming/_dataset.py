"""``StreamingDataset``: WebDataset shards in object storage as a resumable
``torch.utils.data.IterableDataset``.

It is what a training script hands to ``torch_spdl.DataLoader`` (or torch's): each
DataLoader worker of each rank reads its own shards of the epoch (:mod:`._plan`) through a
pipeline of its own (:mod:`._stream`: ranged reads on an event loop, tar splitting), mixes
the raw samples in a shuffle buffer (:mod:`._progress`), and decodes the ones the buffer
lets out on decode threads, a few ahead of the training loop, delivering them in order.
``state_dict()`` / ``load_state_dict()`` save and restore that position exactly; the
torch_spdl DataLoader collects them from its workers with each batch, so a loader's
``state_dict()`` resumes a stream mid-epoch; the list of every rank's, given to
``load_state_dict``, resumes it on another number of ranks and workers (:mod:`._elastic`).
With ``cache_dir`` the shards read are kept on local disk for the epochs after
(:mod:`._cache`).

The same stages are available as a ``PipelineBuilder`` (:meth:`StreamingDataset.builder`)
for code that builds its own pipeline.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import torch.utils.data

from ..pipeline import BackgroundTask, PipelineBuilder, PipelineFailure
from ..source import resolve_rank_and_world_size
from ._cache import ShardCache
from ._decode import Decoder, FieldDecoder
from ._elastic import ELASTIC, gather_states, saved_shape, share_of, warn_reordered
from ._plan import Consumer, shards_of
from ._progress import Progress
from ._retry import RetryPolicy
from ._spans import Piece
from ._store import Store, import_filesystems
from ._stream import DecodeAndTransform, Failed, Sample, stream_builder
from ._urls import expand_urls

__all__ = ["StreamingDataset"]

_LG = logging.getLogger("torch_spdl.streaming")

Concurrency = int | Literal["auto"]


class _CloseStore(BackgroundTask):
    """Lives as long as the pipeline; closes the store's sessions on the loop at stop, and
    releases what the run holds of the local cache."""

    def __init__(self, store: Store, cache: ShardCache | None) -> None:
        self.store = store
        self.cache = cache

    async def run(self) -> None:
        import asyncio

        try:
            await asyncio.get_running_loop().create_future()  # until the pipeline stops
        finally:
            try:
                await self.store.close()
            finally:
                if self.cache is not None:
                    self.cache.close()


class _Epoch:
    """One consumer's epoch as a re-iterable source: every iteration starts it afresh."""

    def __init__(self, dataset: StreamingDataset, consumer: Consumer) -> None:
        self.dataset = dataset
        self.consumer = consumer

    def __iter__(self) -> Iterator[Any]:
        return self.dataset._deliver(self.dataset._new_progress(self.consumer))

    def __repr__(self) -> str:
        return f"the epoch of {self.consumer} of {self.dataset!r}"


def _threads(concurrency: Concurrency) -> int:
    """Decode threads per consumer: the number given, or for ``"auto"`` this host's usable
    cores shared out among the consumers on it (the DataLoader workers of this rank, times
    ``LOCAL_WORLD_SIZE`` ranks), at least one: more decode threads than cores only take
    the cores from the training step."""
    if concurrency != "auto":
        return concurrency
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    info = torch.utils.data.get_worker_info()
    workers = 1 if info is None else info.num_workers
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, cores // (workers * ranks))


class StreamingDataset(torch.utils.data.IterableDataset[Any]):
    """Samples of WebDataset tar shards read from URLs (``s3://``, ``http(s)://``,
    ``file://`` or a path), split over ranks and DataLoader workers, shuffled, resumable.

    Each sample is a dict of its decoded fields by extension, with ``"__key__"`` and
    ``"__url__"``, passed through ``transform`` if given. Images, video and audio are
    decoded by :mod:`torch_spdl.io` (images to ``uint8`` ``(C, H, W)`` tensors, resized
    to ``image_size`` while decoding), ``cls``/``txt``/``json``/``npy`` by the usual
    readers, other fields are left as ``bytes``; ``decode={"ext": fn}`` replaces any of them.

    Every epoch, the shards are put in an order drawn from ``(seed, epoch)`` (call
    :meth:`set_epoch`; the global RNGs are never used) and dealt to the consumers, one
    per (rank, DataLoader worker), with no shard read twice and none left out when their
    count divides evenly; otherwise ``drop_last`` / ``even_out`` decide as
    ``DistributedSampler``'s options do (see ``docs/streaming.md``). Samples are mixed in
    a buffer of ``shuffle_buffer`` samples; the buffer holds them undecoded (their
    bytes as read), and a sample is decoded once it is drawn from it.

    Args:
        urls: shard URLs: a list, or a pattern with WebDataset's ``{000..099}`` ranges
            (:func:`expand_urls`).
        image_size: ``(height, width)`` images are resized to while decoded (None: as stored).
        decode: ``{extension: function(bytes) -> value}`` replacing the built-in decoders
            (a function of None keeps the bytes).
        transform: applied to each decoded sample dict, on the decode threads.
        shuffle: shuffle the shards every epoch and the samples in the buffer.
        seed: the seed of every shuffle (the same on every rank).
        shuffle_buffer: how many samples the shuffle buffer holds, undecoded (0: no sample
            shuffle).
        shuffle_initial: how many samples the buffer holds before it lets the first out;
            until it is full it then takes two in for each one out (a first batch after
            this many samples are read rather than ``shuffle_buffer``, the epoch's first
            samples drawn from fewer).
        rank: this process's rank (default: from ``torch.distributed`` or ``RANK``).
        world_size: the number of ranks (default: detected likewise).
        drop_last: with ``even_out``, drop the shards that do not divide evenly instead
            of repeating some.
        even_out: give every consumer the same number of shards (default True).
        read_concurrency: ranged reads in flight per consumer, or ``"auto"``.
        decode_concurrency: decode threads per consumer, or ``"auto"`` (the default): the
            usable cores divided among the consumers on this host (DataLoader workers
            times ``LOCAL_WORLD_SIZE``), at least 1.
        chunk_size: the bytes of one ranged read.
        retry: how failed reads are retried (attempts, backoff, per-request timeout).
        max_failures_per_shard: bad samples (undecodable, or a tar that breaks off) a
            shard may have; one more fails the epoch with :class:`ShardFailure`.
        storage_options: fsspec options, per protocol (``{"s3": {"endpoint_url": ...}}``)
            or one dict for all.
        cache_dir: a local directory to keep the shards read in (None: no cache): later
            epochs read them from disk while the object's size and ETag are unchanged. Every
            DataLoader worker and rank of a host may share one directory.
        cache_limit: the most bytes of shards ``cache_dir`` keeps (the least recently used
            go first; a shard being read is never removed); None: no limit.
    """

    #: ``torch_spdl.source.MixedStreams`` may hand ``load_state_dict`` the list of every
    #: saved consumer's state of this stream (each new consumer then takes its share)
    resumes_from_consumer_states = True

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        image_size: tuple[int, int] | None = None,
        decode: Mapping[str, FieldDecoder | None] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        shuffle_initial: int = 100,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        even_out: bool = True,
        read_concurrency: Concurrency = 16,
        decode_concurrency: Concurrency = "auto",
        chunk_size: int = 16 << 20,
        retry: RetryPolicy | None = None,
        max_failures_per_shard: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        self.urls = expand_urls(urls)
        for name, value in (
            ("read_concurrency", read_concurrency),
            ("decode_concurrency", decode_concurrency),
        ):
            if value != "auto" and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or 'auto', got {value!r}")
        if chunk_size < 1024:
            raise ValueError(f"chunk_size must be at least 1024 bytes, got {chunk_size}")
        if max_failures_per_shard < 0:
            raise ValueError("max_failures_per_shard must be non-negative")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be non-negative, got {shuffle_buffer}")
        if shuffle_initial < 1:
            raise ValueError(f"shuffle_initial must be positive, got {shuffle_initial}")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size must be positive, got {world_size}")
        if cache_limit is not None and cache_limit < 0:
            raise ValueError(f"cache_limit must be non-negative bytes, got {cache_limit}")
        self.decoder = Decoder(image_size, decode)
        # what every consumer needs, imported once here: forked workers start with it
        import_filesystems(self.urls)
        self.decoder.import_media()
        self.transform = transform
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer if shuffle else 0
        self.shuffle_initial = shuffle_initial
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.even_out = even_out
        self.read_concurrency = read_concurrency
        self.decode_concurrency = decode_concurrency
        self.chunk_size = chunk_size
        self.retry = retry if retry is not None else RetryPolicy()
        self.max_failures_per_shard = max_failures_per_shard
        self.storage_options = dict(storage_options or {})
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_limit = cache_limit
        self.epoch = 0
        self._live: Progress | None = None
        self._resume: dict[str, Any] | None = None

    # -- epochs and consumers -------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use the shard order of ``epoch`` from the next iteration on (call it before
        each epoch, as with ``DistributedSampler``)."""
        self.epoch = epoch

    def consumer(self) -> Consumer:
        """Who is reading: this rank, and the DataLoader worker this runs in (if any)."""
        rank, world = resolve_rank_and_world_size(self.rank, self.world_size)
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return Consumer(rank, world, worker, workers)

    def shards(self, consumer: Consumer | None = None) -> list[str]:
        """The URLs ``consumer`` (default: this one) reads this epoch, in order."""
        consumer = self.consumer() if consumer is None else consumer
        picked = shards_of(
            consumer,
            len(self.urls),
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            even_out=self.even_out,
        )
        return [self.urls[i] for i in picked]

    # -- iteration -------------------------------------------------------------------------
    def _progress(self, consumer: Consumer) -> Progress:
        state, self._resume = self._resume, None
        if state is not None and ELASTIC in state:
            if saved_shape(state) != (consumer.world_size, consumer.num_workers):
                if saved_shape(state)[0] == consumer.world_size:  # not said by the loader's
                    warn_reordered(state, stacklevel=2)
                return self._new_progress(consumer, run=state)
            state = state["consumers"][consumer.index]  # the same shape: exactly
        if state is not None:
            saved = Consumer(*state["consumer"])
            if saved != consumer or state["epoch"] != self.epoch:
                raise ValueError(
                    f"the restored state is of epoch {state['epoch']}, {saved}; this "
                    f"iteration is epoch {self.epoch}, {consumer}: the rank, world size "
                    "and number of DataLoader workers must be those of the saved run "
                    "(to resume on others, pass the list of every rank's loader "
                    "state_dict() to the dataset's load_state_dict)"
                )
        return self._new_progress(consumer, state)

    def _new_progress(
        self,
        consumer: Consumer,
        state: dict[str, Any] | None = None,
        run: dict[str, Any] | None = None,
    ) -> Progress:
        """``consumer``'s epoch: afresh, from its ``state``, or its share of the rest of
        a ``run`` saved at another number of consumers (:func:`gather_states`)."""

        def whole_shards(who: Consumer) -> list[Piece]:
            return [Piece(url) for url in self.shards(who)]

        pieces = None
        if run is not None:
            order = {url: i for i, url in enumerate(self.urls)}
            pieces = share_of(run, consumer, whole_shards, lambda u: order.get(u, len(order)))
        elif state is not None and "pieces" in state:  # itself resumed elastically
            pieces = [Piece(u, s, e, f) for u, s, e, f in state["pieces"]]
        return Progress(
            whole_shards(consumer) if pieces is None else pieces,
            consumer,
            self.epoch,
            self.seed,
            self.shuffle_buffer,
            self.max_failures_per_shard,
            state,
            self.shuffle_initial,
            record_pieces=pieces is not None,
        )

    def _drawn(self, progress: Progress) -> Generator[Sample, None, None]:
        """The raw samples this consumer's buffer lets out, in order."""
        store = Store(self.storage_options, self.retry, seed=progress.consumer.index)
        cache = None
        if self.cache_dir is not None:
            cache = ShardCache(self.cache_dir, self.cache_limit)
        stream = stream_builder(
            progress.tasks(),
            store,
            read_concurrency=self.read_concurrency,
            chunk_size=self.chunk_size,
            cache=cache,
        )
        pipeline = stream.add_sink(16).build(background_tasks=[lambda: _CloseStore(store, cache)])
        try:
            with pipeline.auto_stop():
                for item in pipeline:
                    yield from progress.take(item)
        except PipelineFailure as failure:  # a read failed for good: its own error, the URL
            cause = failure.__cause__
            if isinstance(cause, Exception):
                raise cause from None
            raise
        yield from progress.finish()

    def __iter__(self) -> Iterator[Any]:
        progress = self._progress(self.consumer())
        self._live = progress
        yield from self._deliver(progress)

    def _deliver(self, progress: Progress) -> Iterator[Any]:
        """The samples of ``progress``'s epoch: drawn raw from the buffer, decoded on
        threads (up to ``ahead`` of them at once), delivered in the order drawn."""
        if progress.exhausted:
            return
        decode = DecodeAndTransform(self.decoder, self.transform)
        threads = _threads(self.decode_concurrency)
        if threads == 1:
            yield from self._deliver_inline(progress, decode)
            return
        ahead = max(16, 4 * threads)  # samples drawn and being decoded, at most
        pool = ThreadPoolExecutor(threads, thread_name_prefix="torch_spdl.streaming.decode")
        drawn = self._drawn(progress)
        decoding: deque[Future[Sample | Failed]] = deque()
        error: Exception | None = None
        try:
            while True:
                while error is None and len(decoding) < ahead:
                    try:
                        decoding.append(pool.submit(decode, next(drawn)))
                    except StopIteration:
                        break
                    except Exception as exc:  # what was drawn before it goes out first
                        error = exc
                if not decoding:
                    break
                ok, value = progress.settle(decoding.popleft().result())
                if ok:
                    yield value
            if error is not None:
                raise error
        finally:
            drawn.close()
            pool.shutdown(wait=True, cancel_futures=True)

    def _deliver_inline(self, progress: Progress, decode: DecodeAndTransform) -> Iterator[Any]:
        """:meth:`_deliver` with one decode thread: the consumer's own. A pool of one
        thread would add a hand-off per sample (a future, a queue, two wake-ups: about a
        tenth of a 320x240 JPEG's decode) and no parallelism the consumer does not already
        have: ``"auto"`` gives one thread only where each consumer has one core."""
        drawn = self._drawn(progress)
        try:
            for raw in drawn:
                ok, value = progress.settle(decode(raw))
                if ok:
                    yield value
        finally:
            drawn.close()

    def builder(self, consumer: Consumer | None = None) -> PipelineBuilder[Any, Any]:
        """This consumer's samples as a ``PipelineBuilder`` (no sink): shards in the
        epoch's order, raw samples mixed in the buffer, the drawn ones decoded (on
        ``decode_concurrency`` threads), failures held to the budget: the source yields
        the samples :meth:`__iter__` would.
        Add stages (``aggregate``, a collate, ``add_sink``) and build it. Each build starts
        the epoch afresh; it does not resume (the dataset's iteration does).

        Args:
            consumer: who reads (default: detected as in iteration).
        """
        consumer = self.consumer() if consumer is None else consumer
        return PipelineBuilder().add_source(_Epoch(self, consumer))

    # -- resumable state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this consumer stands: what it delivered this epoch, what it drew from
        its shuffle buffer and is still decoding, what the buffer holds (both by identity:
        byte spans), and its RNG state. Small, and cheap to take after every batch."""
        if self._live is not None:
            return self._live.state_dict()
        if self._resume is not None and ELASTIC in self._resume:  # this consumer's share
            consumer, run = self.consumer(), self._resume
            if saved_shape(run) == (consumer.world_size, consumer.num_workers):
                return dict(run["consumers"][consumer.index])
            return self._new_progress(consumer, run=run).state_dict()
        if self._resume is not None:
            return dict(self._resume)
        return self._new_progress(self.consumer()).state_dict()

    def load_state_dict(self, state: dict[str, Any] | list[Any]) -> None:
        """Make the next iteration continue from ``state`` (its epoch becomes current).

        Args:
            state: what :meth:`state_dict` returned, in the same rank and worker; or the
                list of the ``state_dict()`` of every rank's DataLoader (or of every
                consumer's dataset) of the saved run, on any number of ranks and workers:
                call this before the DataLoader is made, whose workers take their share of
                the rest of the epoch from it (exactly the saved run's rest at its shape;
                at another, every undelivered sample once, in another order, with a
                warning).

        Raises:
            ValueError: for a list that misses a consumer of the saved run, or mixes runs.
        """
        if isinstance(state, (list, tuple)):
            state = gather_states(state)
        if ELASTIC in state:
            _, world = resolve_rank_and_world_size(self.rank, self.world_size)
            if saved_shape(state)[0] != world:
                warn_reordered(state, stacklevel=2)
        self.epoch = int(state["epoch"])
        self._resume = dict(state)
        self._live = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.urls)} shards, e.g. {self.urls[0]!r})"
