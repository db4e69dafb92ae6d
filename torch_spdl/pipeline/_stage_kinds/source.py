"""The source node: iterates the user's (async) iterable into the first channel.

Its one worker is :meth:`SourceNode.work` (a thread) or :meth:`SourceNode.awork` (a task),
and it ends as every stage does (the template in ``node.py``): a source holds nothing to
flush and has no stage hooks, so its end is closing the first channel, with the source's
error if iterating it raised (an error of the user's iterable: the source's own failure,
noted as such, not an internal one).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Iterable
from typing import Any

from .._core.protocols import StoppableSource
from .._core.stats import Counters
from .._wire.channel import Channel, ChannelAborted
from .node import Node
from .pace import Pace

__all__ = ["SourceNode", "on_loop"]


def on_loop(source: Any) -> bool:
    """Whether ``source`` runs on the pipeline's event loop: an async iterable that is not
    also a sync one (a sync iterable runs on a thread of its own)."""
    return not isinstance(source, Iterable) and isinstance(source, AsyncIterable)


class SourceNode(Node):
    """Runs a sync iterable on its own thread (so it may block, or be another Pipeline)
    and an async iterable as a task on the pipeline's event loop."""

    def __init__(self, source: Iterable[Any] | AsyncIterable[Any], outbox: Channel[Any]) -> None:
        super().__init__("source", None, outbox)
        self.source = source
        self.on_loop = on_loop(source)

    def on_stop(self) -> None:
        # A Pipeline used as a source blocks in its own get(); stopping it releases us.
        if isinstance(self.source, StoppableSource):
            self.source.stop_source()

    def _source_failed(self, exc: Exception) -> None:
        """A failing source fails the pipeline like a stage: the items it made before go
        through, then the consumer gets a ``PipelineFailure`` holding this error."""
        exc.add_note(f"torch_spdl: raised while iterating the pipeline's source {self.source!r}")
        self.fail(exc)

    def work(self, index: int, counters: Counters) -> None:
        source = self.source
        assert isinstance(source, Iterable)  # run here only when not on the loop
        if self.outbox.bulk:
            self._work_bulk(source, counters)
            return
        put = self.outbox.put
        try:
            for item in source:
                put(item)
                counters.num_out += 1
        except ChannelAborted:
            raise
        except Exception as exc:
            self._source_failed(exc)

    def _work_bulk(self, source: Iterable[Any], counters: Counters) -> None:
        """Stage the items and flush a paced number at a time (``pace.py``); a reader that
        waits is served at once, and one that comes while the iterator blocks takes the
        staged items itself (the channel's notes), so no key waits for the next."""
        outbox, clock = self.outbox, time.perf_counter
        flush, waiting = outbox.flush, outbox.has_readers_waiting
        segment = outbox.staging()
        stage, pace = segment.append, Pace()
        room = outbox.room
        limit = 1
        made, t0 = 0, clock()
        try:
            try:
                for item in source:
                    stage(item)
                    counters.num_out += 1
                    made += 1
                    if made >= limit or waiting():
                        pace.update(clock() - t0, made)
                        flush(segment)
                        limit = min(pace.limit, room())
                        made, t0 = 0, clock()
            finally:
                flush(segment)  # what the source made before it ended or raised
        except ChannelAborted:
            raise
        except Exception as exc:
            self._source_failed(exc)

    async def awork(self, index: int, counters: Counters) -> None:
        aput = self.outbox.aput
        source = self.source
        assert isinstance(source, AsyncIterable)  # run here only when on the loop
        try:
            async for item in source:
                await aput(item)
                counters.num_out += 1
        except ChannelAborted:
            raise
        except Exception as exc:
            self._source_failed(exc)
