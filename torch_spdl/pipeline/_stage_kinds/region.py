"""Execution regions: ``to(ProcessPoolExecutorConfig(...))`` ... ``to(MAIN_PROCESS)``.

A GIL-bound op gains nothing from threads, and handing each item to a process pool
(``pipe(op, executor=ProcessPoolExecutor(...))``) pays a round trip and two pickles per
item *per stage*. A region instead runs a whole run of stages as one nested pipeline in
each of ``max_workers`` worker processes: only the region's inputs and outputs cross the
process boundary, in chunks, and the values between its stages never leave the worker.

How one region runs (:class:`RegionStage`, one node of the outer pipeline):

- The workers are started by ``fork`` (on Linux, unless the config names another start
  method) when the pipeline starts, so the region's ops need not pickle: the child already
  has them. Each worker builds the region's stages as a pipeline of its own, whose source
  reads the chunks its pipe brings.
- Per worker, a *feeder* thread takes the items waiting in the region's input queue (up
  to :data:`CHUNK` at a time: the first one blocking, the rest only if already there) and
  sends them as one pickled message (the process wire's ``Items``; ``End`` closes the
  input); a *receiver* thread puts the worker's results, which
  come in chunks of what its sink held, on the region's output. All feeders pull from one
  queue, so a busy worker simply takes less. How far a feeder runs ahead of its worker is
  bounded by the pipe's buffer (the worker reads only as its first queue has room).
- Failures: items that fail inside a worker are logged there and counted against the
  build's ``max_failures`` *per worker* (each worker's pipeline has its own budget); a
  worker whose pipeline fails sends its ``PipelineFailure`` (the original exception
  types, with notes naming the stage and the item) and the region fails the pipeline
  with it, noted with the worker's number and pid. A worker that dies (killed, crashed)
  is reported at once as a ``RuntimeError`` naming it and its exit code: its receiver
  waits on its pipe and its exit together, so nothing waits for it.
- Shutdown: at the end of the stream each worker receives an end mark, drains, reports
  and exits, and is joined; ``stop()`` terminates and joins the workers still running.
  No shared memory is used, so none can be left behind.

The messages, the errors that cross, and the start and stop of a worker are the process
wire's (``torch_spdl._procwire``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..._procwire import (
    Child,
    ChildGone,
    End,
    Failed,
    Items,
    PortableError,
    encode,
    pickle_error,
    receive,
    send,
)
from .._core.errors import PipelineFailure, describe_item
from .._core.stats import Counters
from .._declare.config import BuildOptions
from .._declare.placement import ProcessPoolExecutorConfig
from .._wire.channel import EMPTY, EOF, Channel, ChannelAborted
from .node import Node

if TYPE_CHECKING:
    from .._core.protocols import Supervisor

__all__ = ["CHUNK", "RegionBuild", "RegionStage"]

_LG = logging.getLogger("torch_spdl.pipeline")

CHUNK = 64  # most items in one message, either way

# How a worker builds the region's stages into a pipeline of its own: ``build(source,
# stages, options)`` with the build options of the outer pipeline. The build module passes
# its own function (a module-level one, so that it pickles for a spawned worker); taking it
# as an argument keeps the imports one way (build -> region, never back).
RegionBuild = Callable[[Iterable[Any], list[Any], BuildOptions], Any]


# -- the worker process ------------------------------------------------------------------
class _PipeSource:
    """The source of a worker's pipeline: the items of the chunks its pipe brings."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                message = receive(self.conn)
            except EOFError:  # the parent is gone or stopping
                return
            if not isinstance(message, Items):  # End: the end of the region's input
                return
            yield from message.values


def _worker_main(
    build: RegionBuild,
    index: int,
    stages: list[Any],
    options: BuildOptions,
    config: ProcessPoolExecutorConfig,
    inbox: Connection,
    outbox: Connection,
) -> None:
    """Run the region's stages as a pipeline in this worker process."""
    code = 0
    more: Any = None
    try:
        if config.initializer is not None:
            config.initializer(*config.initargs)
        pipeline = build(_PipeSource(inbox), stages, options)
        sink = pipeline._sink
        pipeline.start()
        try:
            while True:
                item = sink.get()
                if item is EOF:
                    break
                chunk = [item]
                while len(chunk) < CHUNK and (more := sink.get_nowait()) is not EMPTY:
                    if more is EOF:
                        break
                    chunk.append(more)
                send(outbox, Items(chunk))
                if more is EOF:
                    break
        except ChannelAborted:
            pass
        failed = sum(s.num_failed for s in pipeline.get_stats())
        pipeline.stop()  # raises the pipeline's failure
        send(outbox, End(failed=failed))
    except (BrokenPipeError, EOFError):  # the parent is gone: nobody to tell
        code = 1
    except BaseException as exc:
        code = 1
        try:
            send(outbox, Failed(PortableError.of(exc)))
        except Exception:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # never run the parent's exit handlers in a forked child


# -- the parent's side -------------------------------------------------------------------
class _Worker:
    def __init__(self, index: int, child: Child, to_worker: Connection, results: Connection):
        self.index = index
        self.child = child
        self.to_worker = to_worker
        self.results = results

    def describe(self) -> str:
        return f"region worker {self.index} (pid {self.child.pid})"


class RegionStage(Node):
    """The stages of one ``to()`` region, run in worker processes (see the module notes)."""

    inbox: Channel[Any]  # a stage always has an upstream (only the source has none)

    def __init__(
        self,
        name: str,
        stages: list[Any],
        config: ProcessPoolExecutorConfig,
        options: BuildOptions,
        inbox: Channel[Any],
        outbox: Channel[Any],
        build: RegionBuild,
    ) -> None:
        self.num = config.workers()
        self.build = build
        super().__init__(name, inbox, outbox, workers=2 * self.num)
        self.concurrency = self.num
        self.stages = stages
        self.config = config
        self.options = options
        self._workers: list[_Worker] = []
        self._stopping = False
        self._failed_inside = 0

    def launch(self, runtime: Supervisor) -> None:
        ctx = self.config.context()
        for i in range(self.num):
            to_worker_r, to_worker_w = ctx.Pipe(duplex=False)
            results_r, results_w = ctx.Pipe(duplex=False)
            child = Child.start(
                ctx,
                _worker_main,
                (self.build, i, self.stages, self.options, self.config, to_worker_r, results_w),
                name=f"torch_spdl-region-{i}",
                child_ends=[to_worker_r, results_w],
            )  # its feeder and its receiver close the parent's ends of its pipes
            worker = _Worker(i, child, to_worker_w, results_r)
            self._workers.append(worker)
        super().launch(runtime)

    def work(self, index: int, counters: Counters) -> None:
        """Thread ``i`` feeds worker process ``i``; thread ``num + i`` receives from it."""
        if index < self.num:
            self._feed(self._workers[index], counters)
        else:
            self._receive(self._workers[index - self.num], counters)

    def _feed(self, worker: _Worker, counters: Counters) -> None:
        get, get_nowait = self.inbox.get, self.inbox.get_nowait
        conn = worker.to_worker
        try:
            while (item := get()) is not EOF:
                chunk = [item]
                while len(chunk) < CHUNK:
                    more = get_nowait()
                    if more is EMPTY:
                        break
                    if more is EOF:
                        item = EOF
                        break
                    chunk.append(more)
                conn.send_bytes(self._pickled(Items(chunk)))
                counters.num_in += len(chunk)
                if item is EOF:
                    break
            send(conn, End())  # the end of the input: drain and report
        except (ChannelAborted, BrokenPipeError, OSError):
            pass  # stopping, or the worker died (its receiver reports that)
        except TypeError as exc:  # an item that cannot be pickled
            self.fail(exc)
        finally:
            conn.close()

    def _pickled(self, message: Items) -> bytes:
        try:
            return encode(message)
        except Exception as exc:
            for item in message.values:  # name the item that cannot cross
                if pickle_error(item) is not None:
                    raise TypeError(
                        f"stage {self.name!r} runs in worker processes, and item "
                        f"{describe_item(item)} cannot be pickled to reach them: {exc}"
                    ) from exc
            raise

    def _receive(self, worker: _Worker, counters: Counters) -> None:
        put = self.outbox.put
        try:
            while True:
                try:  # on the pipe and the worker's exit together
                    message = worker.child.receive(worker.results, None)
                except (ChildGone, OSError):
                    if not self._stopping:
                        self._died(worker)
                    return
                if isinstance(message, Items):
                    for item in message.values:
                        put(item)
                    counters.num_out += len(message.values)
                elif isinstance(message, End):
                    with self._lock:
                        self._num_failed += message.failed
                    worker.child.join(timeout=30)
                    return
                else:
                    self.fail(self._raised_in(worker, message))
                    return
        finally:
            worker.results.close()

    def _raised_in(self, worker: _Worker, message: Failed) -> BaseException:
        error = message.error.rebuild(worker.describe())
        if isinstance(error, PipelineFailure) and len(error.exceptions) == 1:
            error = error.exceptions[0]  # the stage's error, with its notes
        error.add_note(f"torch_spdl: raised in {worker.describe()} of {self.name!r}")
        return error

    def _died(self, worker: _Worker) -> None:
        worker.child.join(timeout=5)
        error = RuntimeError(
            f"{worker.describe()} of stage {self.name!r} exited unexpectedly with code "
            f"{worker.child.exitcode}; the items it held are lost"
        )
        self.fail(error)

    def on_stop(self) -> None:
        self._stopping = True
        for worker in self._workers:
            worker.child.terminate()
        for worker in self._workers:
            worker.child.stop(5, kill_at_once=True)

    def unblock_workers(self) -> None:
        # a region that failed stops its workers now: their feeders and receivers then
        # see closed pipes and leave, and no process outlives the failure
        self._stopping = True
        for worker in self._workers:
            worker.child.terminate()
