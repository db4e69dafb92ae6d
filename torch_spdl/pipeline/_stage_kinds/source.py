"""The source node: iterates the user's (async) iterable into the first channel.

It ends as every stage does (``Node.end_worker`` / ``aend_worker``): a source holds
nothing to flush and has no stage hooks, so its end is closing the first channel, with
the source's error if iterating it raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import TYPE_CHECKING, Any

from .._core.protocols import StoppableSource
from .._wire.channel import Channel, ChannelAborted
from .node import Node

if TYPE_CHECKING:
    from .._core.protocols import Supervisor

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

    @property
    def is_async(self) -> bool:
        return on_loop(self.source)

    def launch(self, runtime: Supervisor) -> None:
        if self.is_async:
            runtime.spawn_task(self._run_async)
        else:
            runtime.spawn_thread(self._run_sync, "torch_spdl-source")

    def on_stop(self) -> None:
        # A Pipeline used as a source blocks in its own get(); stopping it releases us.
        if isinstance(self.source, StoppableSource):
            self.source.stop_source()

    def _source_failed(self, exc: Exception) -> None:
        """A failing source fails the pipeline like a stage: the items it made before go
        through, then the consumer gets a ``PipelineFailure`` holding this error."""
        exc.add_note(f"torch_spdl: raised while iterating the pipeline's source {self.source!r}")
        self.fail(exc)

    def _run_sync(self) -> None:
        counters = self.new_counters()
        put = self.outbox.put
        source = self.source
        try:
            assert isinstance(source, Iterable)  # run here only when not is_async
            for item in source:
                put(item)
                counters.num_out += 1
        except ChannelAborted:
            pass
        except Exception as exc:
            self._source_failed(exc)
        except BaseException as exc:
            self.crash(exc)
        finally:
            self.end_worker()

    async def _run_async(self) -> None:
        counters = self.new_counters()
        aput = self.outbox.aput
        source = self.source
        try:
            assert isinstance(source, AsyncIterable)  # run here only when is_async
            async for item in source:
                await aput(item)
                counters.num_out += 1
        except ChannelAborted:
            pass
        except Exception as exc:
            self._source_failed(exc)
        finally:
            await self.aend_worker()
