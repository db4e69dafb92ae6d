"""``run_pipeline_in_subprocess``: build and run a pipeline in a child process, iterate here.

One child serves every iteration of the result (SPDL's behaviour: the source lives there,
so its state carries over, a sampler counting its epochs keeps counting); the parent
grants the child one credit per item it takes, and tags each run, so an iteration
abandoned midway leaves nothing behind for the next. Executors cannot cross a process
boundary: each user pool travels as a :class:`_PoolSpec` and the child makes an equal one.
The child's messages are the process wire's (``Items``, ``End``, ``Failed``, each tagged
with its run; ``torch_spdl._procwire``), the parent's commands are typed here (:class:`Run`,
:class:`Credit`, :class:`Abandon`, the wire's ``Stop``); the error type is
``_subprocess.py``'s.

Why this file is one piece (just over 400 lines): it is both ends of one protocol, the
child's loop (:class:`_EpochChild`) and the parent's (:class:`_InSubprocess`), whose
commands, credits and epoch tags must change together; apart, each half would make sense
only with the other open beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, TypeVar

from .._procwire import (
    Child,
    ChildGone,
    End,
    Failed,
    Items,
    PortableError,
    Stop,
    receive,
    send,
)
from ._builder import PipelineBuilder
from ._declare.config import BuildOptions, PipeConfig, PipelineSpec
from ._plugins.priority import PriorityExecutorEntrypoint
from ._run.assemble import build
from ._subprocess import SubprocessError, check_picklable, child_error

__all__ = ["run_pipeline_in_subprocess"]

_LG = logging.getLogger("torch_spdl.pipeline")

T = TypeVar("T")


class Run(NamedTuple):
    """Run the pipeline once, as run ``run``; the parent grants ``credits`` items first."""

    run: int
    credits: int


class Credit(NamedTuple):
    """The parent took an item: the child may send one more."""


class Abandon(NamedTuple):
    """The parent stopped iterating run ``run``: the child ends it."""

    run: int


Command = Run | Credit | Abandon | Stop


class _PoolSpec:
    """A picklable stand-in for a user's thread or process pool: an executor cannot cross
    a process boundary, so the child makes an equal one (same kind, same size)."""

    def __init__(self, executor: Executor) -> None:
        if isinstance(executor, ProcessPoolExecutor):
            self.kind = "process"
        elif isinstance(executor, ThreadPoolExecutor):
            self.kind = "thread"
        else:
            raise TypeError(
                f"run_pipeline_in_subprocess: executor {executor!r} cannot be sent to the "
                "subprocess; use a ThreadPoolExecutor or ProcessPoolExecutor (recreated there)"
            )
        self.max_workers: int | None = getattr(executor, "_max_workers", None)

    def create(self) -> Executor:
        if self.kind == "thread":
            return ThreadPoolExecutor(self.max_workers, thread_name_prefix="torch_spdl-pool")
        # the child runs threads: its worker processes must not be forked from it
        return ProcessPoolExecutor(self.max_workers, mp_context=mp.get_context("spawn"))


def _portable(config: Any) -> PipelineSpec:
    """``config`` (a ``PipelineSpec``, or SPDL's ``defs.PipelineConfig``) with its
    executors made picklable."""
    to_builder_config = getattr(config, "_to_builder_config", None)
    if to_builder_config is not None:
        config = to_builder_config()
    # a _PoolSpec stands in for the executor only in transit; _child_pools swaps it back
    stages = [
        dataclasses.replace(s, executor=_PoolSpec(s.executor))  # type: ignore[arg-type]
        if isinstance(s, PipeConfig)
        and s.executor is not None
        and not isinstance(s.executor, PriorityExecutorEntrypoint)  # pickles itself
        else s
        for s in config.stages
    ]
    return dataclasses.replace(config, stages=stages)


def _pool_kind(executor: object) -> str | None:
    """``"thread"`` or ``"process"`` for a stage's executor once made portable, else None."""
    if isinstance(executor, _PoolSpec):
        return executor.kind
    if isinstance(executor, PriorityExecutorEntrypoint):
        return executor.owner.kind
    return None


def _child_pools(config: PipelineSpec) -> tuple[PipelineSpec, list[Executor]]:
    """The config with each ``_PoolSpec`` made into a live pool (in the child)."""
    pools: list[Executor] = []
    stages = []
    for s in config.stages:
        if isinstance(s, PipeConfig) and isinstance(s.executor, _PoolSpec):
            pools.append(s.executor.create())
            s = dataclasses.replace(s, executor=pools[-1])
        stages.append(s)
    return dataclasses.replace(config, stages=stages), pools


class _EpochChild:
    """The child of ``run_pipeline_in_subprocess``: one process for every iteration.

    It waits for commands on ``cmd``: :class:`Run` builds a fresh pipeline from the
    config (its pools made once and reused; a continuous one is built once and yields one
    epoch per run) and streams its items back tagged with the run, as many as the parent
    has granted credits for (one :class:`Credit` per item it took); :class:`Abandon`
    ends that run early (the parent stopped iterating); ``Stop`` or a closed pipe ends
    the child. The source object lives here across runs, so a source with its own epoch
    counter or shuffle state keeps advancing, as it would in one process.
    """

    def __init__(self, config: PipelineSpec, options: BuildOptions) -> None:
        self.config = config
        self.options = options

    def __call__(
        self, cmd: Connection, out: Connection, initializer: Callable[[], None] | None
    ) -> None:
        pools: list[Executor] = []
        continuous: Any = None
        try:
            if initializer is not None:
                initializer()
            config, pools = _child_pools(self.config)
            credits = 0
            while True:
                try:
                    msg: Command = receive(cmd)
                except EOFError:
                    return  # the parent is gone
                if isinstance(msg, Stop):
                    return
                if not isinstance(msg, Run):
                    continue  # a credit or an abandon of a run already over
                epoch = msg.run
                credits = msg.credits
                if config.continuous:
                    if continuous is None:
                        continuous = build(config, self.options)
                        continuous.start()
                    stream = continuous.get_iterator()
                    pipeline = None
                else:
                    pipeline = build(config, self.options)
                    pipeline.start()
                    stream = pipeline.get_iterator()
                try:
                    credits = self._run(stream, cmd, out, epoch, credits)
                    if pipeline is not None:
                        pipeline.stop()  # raises the failure, if any
                    elif continuous._runtime.failure is not None:  # noqa: SLF001
                        continuous.stop()
                    send(out, End(epoch))
                except _Quit:
                    return
                except _Abandoned:
                    if pipeline is not None:
                        with contextlib.suppress(Exception):
                            pipeline.stop()
                    send(out, End(epoch))
                except Exception as exc:
                    if pipeline is not None:
                        with contextlib.suppress(Exception):
                            pipeline.stop()
                    _send_error(out, epoch, exc)
                    if continuous is not None:
                        return  # a failed continuous pipeline cannot go on
        finally:
            if continuous is not None:
                with contextlib.suppress(Exception):
                    continuous.stop()
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)
            out.close()

    @staticmethod
    def _run(
        stream: Iterator[Any], cmd: Connection, out: Connection, epoch: int, credits: int
    ) -> int:
        def handle(msg: Command) -> int:
            if isinstance(msg, Credit):
                return 1
            if isinstance(msg, Stop):
                raise _Quit
            if isinstance(msg, Abandon) and msg.run == epoch:
                raise _Abandoned
            return 0

        for item in stream:
            while cmd.poll():
                credits += handle(receive(cmd))
            while credits <= 0:
                try:
                    credits += handle(receive(cmd))
                except EOFError:
                    raise _Quit from None
            send(out, Items([item], epoch))  # by value, as the wire's pickle is
            credits -= 1
        return credits


class _Quit(Exception):
    pass


class _Abandoned(Exception):
    pass


def _send_error(out: Connection, epoch: int | None, exc: BaseException) -> None:
    send(out, Failed(PortableError.of(exc), epoch))


def _epoch_child_main(
    child: _EpochChild,
    cmd: Connection,
    out: Connection,
    initializer: Callable[[], None] | None,
) -> None:
    try:
        child(cmd, out, initializer)
    except BaseException as exc:  # initializer or pool creation failed: report it
        with contextlib.suppress(Exception):
            _send_error(out, None, exc)  # no run's: the child itself failed


class _ChildHandle:
    """The parent's side of one ``_EpochChild`` process (stopped by ``close``)."""

    def __init__(self, ctx: Any, child: _EpochChild, initializer: Any, daemon: bool) -> None:
        self.cmd, cmd_child = ctx.Pipe(duplex=False)[::-1]
        self.out, out_writer = ctx.Pipe(duplex=False)
        self.child = Child.start(
            ctx,
            _epoch_child_main,
            (child, cmd_child, out_writer, initializer),
            name="torch_spdl-pipeline-subprocess",
            daemon=daemon,
            child_ends=[cmd_child, out_writer],
            ends=[self.cmd, self.out],
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            send(self.cmd, Stop())
        self.cmd.close()
        self.child.stop(30)
        self.child.close_pipes()


class _InSubprocess(Iterable[T]):
    """What ``run_pipeline_in_subprocess`` returns: every iteration runs a fresh pipeline
    in the same child process (started at the first iteration, stopped when this object
    is dropped or :meth:`close` is called), so the source's state carries over."""

    def __init__(self, child: _EpochChild, kwargs: dict[str, Any]) -> None:
        self._child = child
        self._ctx = mp.get_context(kwargs["mp_context"])
        self._buffer_size = max(kwargs["buffer_size"], 1)
        self._initializer = kwargs["initializer"]
        self._timeout = kwargs["timeout"]
        self._daemon = kwargs["daemon"]
        self._handle: _ChildHandle | None = None
        self._finalizer: Any = None
        self._epoch = 0
        self._busy = False
        self._stopping = False  # stop_source: a dead child ends the iteration quietly

    def stop_source(self) -> None:
        """Called when a pipeline this feeds stops: end the child now, so that an
        iteration waiting for its next item returns at once (quietly)."""
        handle = self._handle
        if handle is None or not self._busy:
            return  # no iteration waits: the child (and the source's state) stays
        self._stopping = True
        with contextlib.suppress(Exception):
            send(handle.cmd, Stop())
        handle.child.join(timeout=2)
        handle.child.terminate()

    def close(self) -> None:
        """Stop and join the child process (the next iteration starts a new one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._handle = self._finalizer = None

    def __iter__(self) -> Iterator[T]:
        if self._busy:
            raise RuntimeError(
                "run_pipeline_in_subprocess: the previous iteration is still open; finish "
                "or close it before iterating again (they share one child process)"
            )
        if self._handle is None or not self._handle.child.is_alive():
            self.close()
            self._stopping = False
            self._handle = _ChildHandle(self._ctx, self._child, self._initializer, self._daemon)
            self._finalizer = weakref.finalize(self, self._handle.close)
        self._epoch += 1
        return self._iterate(self._handle, self._epoch)

    def _iterate(self, handle: _ChildHandle, epoch: int) -> Iterator[T]:
        self._busy = True
        send(handle.cmd, Run(epoch, self._buffer_size))
        child = handle.child
        try:
            while True:
                try:
                    message = child.receive(handle.out, self._timeout)
                except TimeoutError:
                    raise TimeoutError(
                        f"no item arrived from the subprocess within {self._timeout} s"
                    ) from None
                except ChildGone as gone:
                    if self._stopping:
                        return
                    how = (
                        "closed its pipe and exited" if gone.closed_pipe else "exited unexpectedly"
                    )
                    raise SubprocessError(
                        f"the pipeline's subprocess (pid {child.pid}) {how} "
                        f"with code {child.exitcode}"
                    ) from None
                if message.run is not None and message.run != epoch:
                    continue  # what an abandoned iteration still had in flight
                if isinstance(message, Items):
                    with contextlib.suppress(OSError):  # a dead child is reported next wait
                        send(handle.cmd, Credit())
                    yield from message.values
                elif isinstance(message, End):
                    return
                else:
                    raise child_error(message, child)
        except GeneratorExit:  # the consumer stopped early: the child drops this run
            with contextlib.suppress(Exception):
                send(handle.cmd, Abandon(epoch))
            raise
        except BaseException:
            # a failed run: stop the child now (the error may be kept, and with it this
            # frame); the next iteration starts a new one
            self.close()
            raise
        finally:
            self._busy = False


def run_pipeline_in_subprocess(
    config: Any,
    *,
    buffer_size: int = 3,
    initializer: Callable[[], None] | None = None,
    mp_context: str | None = "spawn",
    timeout: float | None = None,
    **build_kwargs: Any,
) -> Iterable[Any]:
    """Build the pipeline ``config`` declares in a child process, run it there, and
    yield its items here.

    Thread and process pools given to ``pipe(executor=...)`` are recreated in the child
    (same kind and size). The result can be iterated again: the child process starts at
    the first iteration and stays; each iteration runs a fresh pipeline there (a
    continuous one yields its next epoch), so the source's state carries over (a sampler
    counting its epochs keeps counting). The child stops when the result is dropped or
    its ``close()`` is called.

    Args:
        config: the declaration: SPDL's ``torch_spdl.pipeline.defs.PipelineConfig``, or
            a ``PipelineSpec`` (``PipelineBuilder.get_config()``). Passing a
            ``PipelineBuilder`` still works and is deprecated.
        buffer_size: items in flight between the child and here.
        initializer: run first in the child.
        mp_context: how to start the child (``spawn`` by default).
        timeout: the most seconds to wait for each item (``TimeoutError``).
        build_kwargs: the build's options, the keywords of ``build_pipeline``
            (``num_threads``, ``max_failures``...; see :class:`BuildOptions`), used by
            every build in the child.
    """
    if isinstance(config, PipelineBuilder):
        warnings.warn(
            "run_pipeline_in_subprocess(builder) is deprecated: pass builder.get_config()",
            DeprecationWarning,
            stacklevel=2,
        )
        config = config.get_config()
    options = BuildOptions(**build_kwargs)  # an unknown keyword fails here, not in the child
    child = _EpochChild(_portable(config), options)
    has_process_pool = any(
        isinstance(s, PipeConfig) and _pool_kind(s.executor) == "process"
        for s in child.config.stages
    )
    kwargs = dict(
        buffer_size=buffer_size,
        initializer=initializer,
        mp_context=mp_context,
        timeout=timeout,
        daemon=not has_process_pool,  # a daemonic child may not start the pool's processes
    )
    hint = "use module-level functions and picklable sources"
    for what, obj in (("the pipeline", child), ("initializer", initializer)):
        check_picklable("run_pipeline_in_subprocess", what, obj, hint)
    return _InSubprocess(child, kwargs)
