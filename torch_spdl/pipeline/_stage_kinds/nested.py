"""Pipelines inside a pipeline: SPDL's ``Merge`` (several pipelines feed one) and
``PathVariants`` (each item takes one of several paths, which join again).

Both are built from whole pipelines, run as they always run, rather than from new kinds of
node in the chain, so every stage keeps its usual loop, failure handling and shutdown:

- :class:`MergedSource` is the source of the outer pipeline: it builds and starts one
  pipeline per ``MergeConfig`` entry and passes their items to the merge op (SPDL's
  ``(name, input_queues, output_queue)`` coroutine; by default, items as they come). A
  failing inner pipeline fails the outer one's source with its ``PipelineFailure``.
- :class:`PathVariantsStage` is one stage of the outer pipeline: a router thread puts each
  item on the channel of the path ``router(item)`` names, each path is a pipeline whose
  source is that channel, and one thread per path moves its results to the outer stage's
  output. A router error or an index out of range fails the item, as an op error does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .._core.stats import Counters
from .._declare.failures import FailureLimit
from .._plugins.hooks import StageInfo
from .._wire.channel import EOF, Channel, ChannelAborted
from .node import Node

if TYPE_CHECKING:
    from .._core.protocols import InnerPipeline

__all__ = ["ChannelSource", "MergedSource", "PathVariantsStage", "merge_as_available"]

MergeOp = Callable[[Any, Sequence[asyncio.Queue], asyncio.Queue], Any]


async def merge_as_available(
    info: Any, input_queues: Sequence[asyncio.Queue], output_queue: asyncio.Queue
) -> None:
    """The default merge: every item of every input, in the order they arrive."""

    async def pump(queue: asyncio.Queue) -> None:
        while (item := await queue.get()) is not EOF:
            await output_queue.put(item)

    await asyncio.gather(*(pump(q) for q in input_queues))


class MergedSource:
    """An async iterable over the merged outputs of several pipelines (see module notes).

    Each iteration builds the inner pipelines afresh with ``make_pipeline`` (the outer
    build's options), so the outer pipeline can be built and run many times.
    """

    def __init__(
        self,
        configs: Sequence[Any],
        op: MergeOp | None = None,
        make_pipeline: Callable[[Any], InnerPipeline] | None = None,
    ) -> None:
        if not configs:
            raise ValueError("Merge needs at least one upstream pipeline config")
        self.configs = list(configs)
        self.op = op
        self.make_pipeline = make_pipeline
        self._running: list[list[InnerPipeline]] = []

    def with_builder(self, make_pipeline: Callable[[Any], InnerPipeline]) -> MergedSource:
        """A copy that builds its inner pipelines with ``make_pipeline``."""
        return MergedSource(self.configs, self.op, make_pipeline)

    def __repr__(self) -> str:
        return f"Merge({len(self.configs)} pipelines)"

    def __getstate__(self) -> dict[str, Any]:
        return {"configs": self.configs, "op": self.op, "make_pipeline": None, "_running": []}

    def stop_source(self) -> None:
        """Called as the outer pipeline stops: stop the inner ones (wakes their readers)."""
        for pipelines in list(self._running):
            for pipeline in pipelines:
                pipeline.stop_source()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._run()

    async def _run(self) -> AsyncIterator[Any]:
        if self.make_pipeline is None:
            raise RuntimeError("a Merge source is built by build_pipeline")
        loop = asyncio.get_running_loop()
        inner = [self.make_pipeline(c) for c in self.configs]
        self._running.append(inner)
        readers = ThreadPoolExecutor(len(inner), thread_name_prefix="torch_spdl-merge")
        inputs: list[asyncio.Queue] = [asyncio.Queue(2) for _ in inner]
        output: asyncio.Queue = asyncio.Queue(2)
        errors: list[BaseException] = []

        async def feed(pipeline: InnerPipeline, queue: asyncio.Queue) -> None:
            try:
                pipeline.start()
                items = pipeline.get_iterator()
                while (item := await loop.run_in_executor(readers, next, items, EOF)) is not EOF:
                    await queue.put(item)
                await loop.run_in_executor(readers, pipeline.stop)  # raises its failure
            except Exception as exc:
                errors.append(exc)
            await queue.put(EOF)

        async def merge() -> None:
            try:
                # SPDL passes the merge stage's StageInfo (older versions its name: its
                # str() is the name, so code written for either works)
                info = StageInfo("merge", 0)
                await (self.op or merge_as_available)(info, inputs, output)
            finally:
                await output.put(EOF)

        tasks = [asyncio.create_task(feed(p, q)) for p, q in zip(inner, inputs, strict=True)]
        merger = asyncio.create_task(merge())
        try:
            while (item := await output.get()) is not EOF:
                yield item
            await merger  # the op's own error
            if errors:
                raise errors[0]
        finally:
            merger.cancel()
            for task in tasks:
                task.cancel()
            for pipeline in inner:
                pipeline.stop_source()
            await asyncio.gather(merger, *tasks, return_exceptions=True)
            readers.shutdown(wait=True)
            self._running.remove(inner)


class ChannelSource:
    """A sync iterable over what a channel receives (the source of a path's pipeline)."""

    def __init__(self, channel: Channel[Any]) -> None:
        self.channel = channel

    def __iter__(self) -> Iterator[Any]:
        get = self.channel.get
        while True:
            try:
                item = get()
            except ChannelAborted:
                return
            if item is EOF:
                return
            yield item


class PathVariantsStage(Node):
    """Route each item to one of several pipelines and join their outputs (module notes)."""

    inbox: Channel[Any]  # a stage always has an upstream (only the source has none)

    def __init__(
        self,
        name: str,
        router: Callable[[Any], Any],
        make_paths: Sequence[Callable[[Any], InnerPipeline]],
        inbox: Channel[Any],
        outbox: Channel[Any],
        *,
        max_failures: int = -1,
        budget: FailureLimit | None = None,
    ) -> None:
        super().__init__(
            name,
            inbox,
            outbox,
            workers=1 + len(make_paths),
            max_failures=max_failures,
            budget=budget,
        )
        self.router = router
        self.routes: list[Channel[Any]] = [
            Channel(max(inbox.capacity, 2), name=f"{name} path {i}") for i in range(len(make_paths))
        ]
        pairs = zip(make_paths, self.routes, strict=True)
        self.paths = [make(ChannelSource(route)) for make, route in pairs]

    def on_stop(self) -> None:
        for route in self.routes:
            route.abort(None)
        for path in self.paths:
            path.stop_source()

    def work(self, index: int, counters: Counters) -> None:
        """Worker 0 routes the input; worker ``i`` joins path ``i - 1`` into the output."""
        if index == 0:
            self._route(counters)
        else:
            self._join(self.paths[index - 1])

    def _route(self, counters: Counters) -> None:
        loop = asyncio.new_event_loop() if inspect.iscoroutinefunction(self.router) else None
        try:
            while (item := self.inbox.get()) is not EOF:
                counters.num_in += 1
                try:
                    index = self.router(item)
                    if inspect.isawaitable(index):
                        if loop is None:
                            loop = asyncio.new_event_loop()
                        index = loop.run_until_complete(index)
                    if isinstance(index, bool) or not 0 <= index < len(self.routes):
                        raise IndexError(
                            f"the router of {self.name!r} returned {index!r}; there are "
                            f"{len(self.routes)} paths"
                        )
                except Exception as exc:
                    self.record_failure(item, exc)
                    continue
                self.routes[index].put(item)
                counters.num_out += 1
            for route in self.routes:
                route.close()
        except BaseException:  # stopped, or an internal error (the base reports it)
            for route in self.routes:
                route.abort(None)
            raise
        finally:
            if loop is not None:
                loop.close()

    def _join(self, path: InnerPipeline) -> None:
        put = self.outbox.put
        try:
            path.start()
            for item in path.get_iterator():
                put(item)
            path.stop()  # raises the path's failure
        except ChannelAborted:
            path.stop_source()
            raise
        except Exception as exc:
            path.stop_source()
            exc.add_note(f"torch_spdl: raised in a path of {self.name!r}")
            self.fail(exc)
            for route in self.routes:  # the router may wait on this path's channel
                route.abort(None)
