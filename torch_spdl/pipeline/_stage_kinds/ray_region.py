"""Ray regions: ``to(RayActors(num_actors=n, ...))`` ... ``to(MAIN_PROCESS)``.

A process region (:mod:`.region`) spreads a run of stages over this machine's cores; a
Ray region spreads it over a cluster's, in ``n`` Ray actors placed where the actor
options say (``resources``, ``num_gpus``, a node). What the two share: only the region's
inputs and outputs cross, in chunks, and the region's stages run as a nested pipeline
built by the build function the build module passes in.

How one region runs (:class:`RayRegionStage`, one node of the outer pipeline, two
threads):

- At start the region's stages (and the build function) are cloudpickled and put in the
  object store once; every actor (:class:`RegionActor`, made by ``ActorSet`` with
  ``max_restarts=0``) reads that one object. A *feeder* thread takes the items waiting
  (up to :data:`CHUNK`: the first one blocking, the rest only if already there) and sends
  them as one actor call to the actor with the fewest chunks in flight, at most
  :data:`IN_FLIGHT` per actor: a slow consumer never fills the object store.
- A chunk is a unit of work, not a slice of a stream: the actor runs it through a fresh
  nested pipeline and returns all of its outputs at once (tensors out of band: ``pack``).
  So a chunk's result is all or nothing, and a *receiver* thread delivers the chunks'
  outputs in the order the chunks were sent (within a chunk, in the nested pipeline's
  order): ``output_order="input"`` inside the region holds across it. The price is that
  an ``aggregate`` would batch within a chunk, so a Ray region refuses one (aggregate
  after ``to(MAIN_PROCESS)``), and an ``"auto"`` stage inside is tuned per chunk, from
  what the actor's autotuner remembers of the chunks before.
- Failures: a failed item is recorded in the actor (by a task hook) with its stage, the
  item and the exception, and counted here against the build's ``max_failures`` as if it
  had failed here; the one that goes over fails the pipeline with the original exception
  type, noted with the stage, the item and the actor's traceback. ``get_stats()``'s row
  of the region counts the items that ran remotely.
- An actor that dies (``ray.kill``, its node lost: ``RayActorError``, ``ObjectLostError``,
  ``ActorUnavailableError``) is replaced in its slot (``ActorSet.replace``, a bounded
  budget) and every chunk it held is sent to the replacement: since a chunk's outputs are
  delivered only once its whole result is back, nothing is lost or delivered twice.
- Shutdown: the end of the stream, a failure and ``stop()`` all kill every actor
  (``ActorSet.shutdown``): nothing outlives the pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._procwire import PortableError
from .._core.errors import PipelineFailure, describe_item
from .._core.stats import Counters
from .._declare.config import AggregateConfig, BuildOptions
from .._declare.failures import FailureLimit
from .._declare.placement import RayActors
from .._plugins.hooks import StageInfo, TaskHook
from .._wire.channel import EMPTY, EOF, Channel
from .node import Node
from .region import CHUNK, RegionBuild

if TYPE_CHECKING:
    from ..._ray import ActorSet
    from .._core.protocols import Supervisor

# ``torch_spdl._ray`` (and with it torch, for the tensors' out-of-band form) is imported
# where a Ray region is built or run, never with this module: every build imports it.

__all__ = ["IN_FLIGHT", "RayRegionStage", "RegionActor"]

_LG = logging.getLogger("torch_spdl.pipeline")

IN_FLIGHT = 2  # chunks sent to one actor and not yet received
_POLL_S = 0.2  # how often a wait for a chunk looks whether the pipeline stops
_START_S = 120.0  # how long the actors may take to be placed


class Failure(NamedTuple):
    """An item that failed in an actor: its stage, the item in words, the exception."""

    stage: str
    item: str
    error: PortableError


class Reply(NamedTuple):
    """One chunk's result: its outputs packed, its failed items, each inner stage's
    ``(name, num_in, num_out, num_failed, op_time)``, or the nested pipeline's error."""

    data: bytes
    arrays: list[Any]
    failures: list[Failure]
    stages: list[tuple[str, int, int, int, float]]
    error: PortableError | None = None


# -- the actor ---------------------------------------------------------------------------
class _FailureLog(TaskHook):
    """Records each failed task of a stage, with its item (the actor's nested pipeline)."""

    def __init__(self, failures: list[Failure], info: StageInfo) -> None:
        self.failures = failures
        self.stage = info.name

    @contextlib.asynccontextmanager
    async def task_hook(self, input_item: Any = None) -> AsyncIterator[None]:
        try:
            yield
        except StopAsyncIteration:  # a generator op's end, not a failure
            raise
        except Exception as exc:
            error = PortableError.of(exc)
            self.failures.append(Failure(self.stage, describe_item(input_item), error))
            raise


class RegionActor:
    """A Ray actor that runs chunks through a region's stages (see the module notes).

    Args:
        blob: the cloudpickled ``(build, stages, options)`` of the region.
    """

    def __init__(self, blob: bytes) -> None:
        from ray import cloudpickle

        self._error: PortableError | None = None
        try:
            self._build, self._stages, self._options = cloudpickle.loads(blob)
        except Exception as exc:  # a module missing on the cluster: told with each chunk
            self._error = PortableError.of(exc)

    def ready(self) -> int:
        return os.getpid()

    def run(self, data: bytes, arrays: list[Any]) -> Reply:
        """Run one chunk (its tensors copied: an op may change its input in place, and the
        chunk may be run again elsewhere) through a fresh pipeline of the region's stages."""
        from ..._ray import pack, unpack

        if self._error is not None:
            return Reply(b"", [], [], [], self._error)
        failures: list[Failure] = []
        options = dataclasses.replace(
            self._options,
            max_failures=-1,  # the region's owner counts them against the build's budget
            task_hook_factory=functools.partial(_hooks, failures),
        )
        items = unpack(data, [a.copy() for a in arrays])
        try:
            pipeline = self._build(items, self._stages, options)
            with pipeline.auto_stop():
                outputs = list(pipeline)
            data, arrays = pack(outputs)
        except Exception as exc:
            return Reply(b"", [], failures, [], PortableError.of(exc))
        stats = pipeline.get_stats()[1:]  # the source's row is the chunk's
        counts = [(s.name, s.num_in, s.num_out, s.num_failed, s.op_time) for s in stats]
        return Reply(data, arrays, failures, counts)


def _hooks(failures: list[Failure], info: StageInfo) -> list[TaskHook]:
    return [_FailureLog(failures, info)]


# -- the owner's side --------------------------------------------------------------------
class _Chunk:
    __slots__ = ("arrays", "data", "gen", "ref", "size", "slot")

    def __init__(self, data: bytes, arrays: list[Any], size: int) -> None:
        self.data, self.arrays, self.size = data, arrays, size
        self.slot, self.gen, self.ref = 0, 0, None


class RayRegionStage(Node):
    """The stages of one ``to(RayActors(...))`` region, run in Ray actors (module notes)."""

    inbox: Channel[Any]

    def __init__(
        self,
        name: str,
        stages: list[Any],
        config: RayActors,
        options: BuildOptions,
        inbox: Channel[Any],
        outbox: Channel[Any],
        build: RegionBuild,
        budget: FailureLimit,
    ) -> None:
        from ..._ray import require_ray

        self.who = f"stage {name!r} (to(RayActors))"
        require_ray(self.who)  # at build: the error says how to install it
        for stage in stages:
            if isinstance(stage, AggregateConfig):
                raise ValueError(
                    f"{self.who}: aggregate() in a Ray region would batch within each chunk; "
                    "aggregate after to(MAIN_PROCESS)"
                )
        super().__init__(name, inbox, outbox, workers=2, budget=budget)
        self.concurrency = config.num_actors
        self.config = config
        self._blob: tuple[RegionBuild, list[Any], BuildOptions] = (build, stages, options)
        self._cond = threading.Condition(self._lock)
        self._pending: deque[_Chunk] = deque()  # sent, in the order sent
        self._load = [0] * config.num_actors  # chunks in flight per actor
        self._actors: ActorSet | None = None
        self._fed_all = False
        self._stopping = False
        self._ray: Any = None  # the ray module, once connected
        self._start_error: BaseException | None = None
        self.remote_counts: dict[str, list[float]] = {}  # inner stage -> in, out, failed, time

    def launch(self, runtime: Supervisor) -> None:
        from ..._ray import connect

        try:  # here, on the thread that starts the pipeline, not on a worker thread
            self._ray = connect(self.who, self.config.address)
        except Exception as exc:  # the feeder fails the pipeline with it
            self._start_error = exc
        super().launch(runtime)

    def work(self, index: int, counters: Counters) -> None:
        from ..._ray import ReplacementsExhausted

        try:
            if index == 0:
                self._feed()
            else:
                self._receive(counters)
        except ReplacementsExhausted as exc:
            self.fail(exc)
        except Exception:
            if not self._stopping:
                raise  # the base reports it as the stage's internal error

    # -- sending ---------------------------------------------------------------------------
    def _start_actors(self) -> None:
        if self._start_error is not None:
            raise self._start_error
        from ray import cloudpickle

        from ..._ray import ActorSet

        ray = self._ray
        blob = ray.put(cloudpickle.dumps(self._blob))
        actor_class = ray.remote(RegionActor)
        actors = ActorSet(
            ray,
            actor_class,
            self.config.num_actors,
            lambda _slot: (blob,),
            self.config.actor_options,
            self.who,
            self.config.replacements(),
            prefix="torch_spdl-region-",
        )
        with self._cond:
            self._actors = actors
            stopping = self._stopping
            self._cond.notify_all()
        if stopping:
            actors.shutdown()
            return
        actors.wait_ready(lambda actor: actor.ready.remote(), _START_S)

    def _feed(self) -> None:
        try:
            try:
                self._start_actors()
            except Exception as exc:
                if not self._stopping:
                    self.fail(exc)
                return
            get, get_nowait = self.inbox.get, self.inbox.get_nowait
            while (item := get()) is not EOF:
                chunk = [item]
                while len(chunk) < CHUNK and (item := get_nowait()) is not EMPTY:
                    if item is EOF:
                        break
                    chunk.append(item)
                if not self._send(chunk) or item is EOF:
                    break
        finally:
            with self._cond:
                self._fed_all = True
                self._cond.notify_all()

    def _send(self, items: list[Any]) -> bool:
        """Send a chunk to the actor with the fewest in flight, waiting for room; False
        once stopping."""
        from ..._ray import pack

        try:
            chunk = _Chunk(*pack(items), len(items))
        except Exception as exc:
            self.fail(TypeError(f"{self.who}: a chunk of items cannot be pickled: {exc}"))
            return False
        with self._cond:
            while not self._stopping and min(self._load) >= IN_FLIGHT:
                self._cond.wait()
            if self._stopping or self._actors is None:
                return False
            chunk.slot = self._load.index(min(self._load))
            self._load[chunk.slot] += 1
            self._submit(chunk)
            self._pending.append(chunk)
            self._cond.notify_all()
        return True

    def _submit(self, chunk: _Chunk) -> None:  # under the lock
        assert self._actors is not None
        chunk.gen = self._actors.generation[chunk.slot]
        chunk.ref = self._actors[chunk.slot].run.remote(chunk.data, chunk.arrays)

    # -- receiving -------------------------------------------------------------------------
    def _receive(self, counters: Counters) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._pending or self._fed_all or self._stopping):
                        self._cond.wait()
                    if self._stopping or not self._pending:
                        return
                    chunk = self._pending[0]
                    ref, gen = chunk.ref, chunk.gen
                errors = self._ray.exceptions
                lost = (errors.RayActorError, errors.ObjectLostError, errors.ActorUnavailableError)
                try:
                    reply: Reply = self._ray.get(ref, timeout=_POLL_S)
                except errors.GetTimeoutError:
                    continue
                except lost as exc:
                    self._replace(chunk, gen, exc)
                    continue
                with self._cond:
                    self._pending.popleft()
                    self._load[chunk.slot] -= 1
                    self._cond.notify_all()
                if not self._deliver(chunk, reply, counters):
                    return
        finally:
            self._shut_down()

    def _replace(self, chunk: _Chunk, gen: int, cause: BaseException) -> None:
        """``chunk``'s actor died: replace it (once per death) and send it every chunk
        the dead one held, in order."""
        with self._cond:
            if self._stopping or self._actors is None:
                return
            if self._actors.replace(chunk.slot, gen, cause):
                _LG.warning(
                    "%s: the actor of worker %d died (%s); replaced",
                    self.who,
                    chunk.slot,
                    type(cause).__name__,
                )
                for held in self._pending:
                    if held.slot == chunk.slot:
                        self._submit(held)

    def _deliver(self, chunk: _Chunk, reply: Reply, counters: Counters) -> bool:
        """Count and put out one chunk's result; False if it failed the pipeline."""
        from ..._ray import unpack

        where = f"Ray actor of worker {chunk.slot} of {self.name!r}"
        if reply.error is not None:
            error = reply.error.rebuild(where)
            if isinstance(error, PipelineFailure) and len(error.exceptions) == 1:
                error = error.exceptions[0]
            error.add_note(f"torch_spdl: raised in the {where}")
            self.fail(error)
            return False
        counters.num_in += chunk.size
        for name, *counts in reply.stages:
            total = self.remote_counts.setdefault(name, [0, 0, 0, 0.0])
            for i, value in enumerate(counts):
                total[i] += value
            counters.op_time += counts[3]
        for failure in reply.failures:
            if not self._failed_remotely(failure, where):
                return False
        outputs = unpack(reply.data, reply.arrays)
        for output in outputs:
            self.outbox.put(output)
        counters.num_out += len(outputs)
        return True

    def _failed_remotely(self, failure: Failure, where: str) -> bool:
        """Count an item that failed in an actor; False if it went over the budget."""
        with self._lock:
            self._num_failed += 1
            count = self._num_failed
        _LG.error(
            "stage %r failed on item %s in the %s: %s: %s",
            failure.stage,
            failure.item,
            where,
            failure.error.type_name,
            failure.error.message,
        )
        if not self.budget.add() or self._failure is not None:
            return True
        error = failure.error.rebuild(where)
        error.add_note(
            f"torch_spdl: stage {failure.stage!r} of {self.name!r} failed on item "
            f"{failure.item} in the {where}; {self.budget.count} failures, more than "
            f"{self.budget.describe()}"
        )
        self.fail(error, num_failures=count)
        return False

    # -- stopping --------------------------------------------------------------------------
    def _shut_down(self) -> None:
        with self._cond:
            self._stopping = True
            actors = self._actors
            self._cond.notify_all()
        if actors is not None:
            actors.shutdown()

    def on_stop(self) -> None:
        self._shut_down()

    def unblock_workers(self) -> None:
        self._shut_down()  # a failed region stops its actors now
