"""The source node: iterates the user's (async) iterable into the first channel."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import TYPE_CHECKING, Any

from ._channel import Channel, ChannelAborted
from ._node import Node

if TYPE_CHECKING:
    from ._protocols import Supervisor

__all__ = ["SourceNode"]


class SourceNode(Node):
    """Runs a sync iterable on its own thread (so it may block, or be another Pipeline)
    and an async iterable as a task on the pipeline's event loop."""

    def __init__(self, source: Iterable[Any] | AsyncIterable[Any], outbox: Channel[Any]) -> None:
        super().__init__("source", None, outbox)
        self.source = source

    @property
    def is_async(self) -> bool:
        return not isinstance(self.source, Iterable) and isinstance(self.source, AsyncIterable)

    def launch(self, runtime: Supervisor) -> None:
        if self.is_async:
            runtime.spawn_task(self._run_async)
        else:
            runtime.spawn_thread(self._run_sync, "torch_spdl-source")

    def on_stop(self) -> None:
        # A Pipeline used as a source blocks in its own get(); stopping it releases us.
        stop = getattr(self.source, "_stop_as_source", None)
        if stop is not None:
            stop()

    def _source_error(self, exc: Exception) -> BaseException | None:
        """A failing source fails the pipeline like a stage: the items it made before go
        through, then the consumer gets a ``PipelineFailure`` holding this error."""
        exc.add_note(f"torch_spdl: raised while iterating the pipeline's source {self.source!r}")
        self.fail(exc)
        return self.end_error()

    def _run_sync(self) -> None:
        try:
            self._iterate_sync()
        finally:
            self.leave()

    def _iterate_sync(self) -> None:
        counters = self.new_counters()
        put = self.outbox.put
        source = self.source
        assert isinstance(source, Iterable)  # run here only when not is_async
        error: BaseException | None = None
        try:
            for item in source:
                put(item)
                counters.num_out += 1
        except ChannelAborted:
            return
        except Exception as exc:
            error = self._source_error(exc)
        except BaseException as exc:
            self.crash(exc)
            error = self.end_error()
        self.outbox.close(error)

    async def _run_async(self) -> None:
        try:
            await self._iterate_async()
        finally:
            self.leave()

    async def _iterate_async(self) -> None:
        counters = self.new_counters()
        aput = self.outbox.aput
        source = self.source
        assert isinstance(source, AsyncIterable)  # run here only when is_async
        error: BaseException | None = None
        try:
            async for item in source:
                await aput(item)
                counters.num_out += 1
        except ChannelAborted:
            return
        except Exception as exc:
            error = self._source_error(exc)
        self.outbox.close(error)
