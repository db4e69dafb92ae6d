"""Declaring a pipeline: ``PipelineBuilder`` records stage specs, and ``build`` runs them.

A builder holds no threads and no state of a run, so one builder can be built any number of
times (each build is a fresh pipeline), pickled to a subprocess, or profiled stage by stage.
It checks each call's arguments and records a frozen spec (``_declare/config.py``); making
the nodes and channels of a run is ``_run/assemble.py``'s job, which
:meth:`PipelineBuilder.build` hands over to.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from ._core.protocols import StoppablePart
from ._declare.config import (
    Concurrency,
    DisaggregateConfig,
    OutputOrder,
    PathVariantsConfig,
    PipeConfig,
    PipelineSpec,
    StageConfig,
    aggregate_config,
)
from ._declare.failures import MaxFailures, check_max_failures
from ._declare.grouping import Aggregator
from ._declare.ops import classify_op, op_name
from ._declare.placement import PlacementConfig
from ._plugins.background import BackgroundTaskFactory
from ._plugins.hooks import StageInfo, TaskHook
from ._plugins.queues import AsyncQueue
from ._run.assemble import build_pipeline
from ._run.pipeline import Pipeline

__all__ = ["PipelineBuilder"]

T = TypeVar("T")
U = TypeVar("U")


class PipelineBuilder(Generic[T, U]):
    """Declare a pipeline stage by stage, then :meth:`build` it.

    Every method returns the builder, so calls chain::

        pipeline = (
            PipelineBuilder()
            .add_source(range(100))
            .pipe(load, concurrency=16)
            .pipe(decode, concurrency=4, output_order="input")
            .aggregate(32)
            .pipe(collate)
            .add_sink(4)
            .build()
        )
    """

    def __init__(self) -> None:
        self._source: Any = None
        self._has_source = False
        self._continuous = False
        self._stages: list[StageConfig] = []
        self._buffer_size: int | None = None
        self._parts: list[StoppablePart] = []

    def add_source(
        self, source: Iterable[T] | AsyncIterable[T], *, continuous: bool = False
    ) -> PipelineBuilder[T, U]:
        """Set the iterable (or async iterable) that feeds the pipeline.

        A sync iterable runs on its own thread, so it may block (a ``Pipeline`` can be the
        source of another); an async iterable runs on the pipeline's event loop. To build
        more than once, pass a re-iterable (list, range, sampler), not a one-shot generator.

        Args:
            source: what feeds the pipeline.
            continuous: SPDL's multi-epoch mode: the pipeline iterates ``source`` again
                for each epoch, and each ``get_iterator()`` (or ``for`` loop) yields one
                epoch and ends at its boundary; ``aggregate`` emits (or with
                ``drop_last`` drops) its partial group at every boundary. The pipeline
                runs until ``stop()``. ``source`` must be re-iterable.
        """
        if self._has_source:
            raise ValueError("the source is already set")
        merged = getattr(source, "_merged_source", None)  # defs.Merge(...)
        if merged is not None:
            source = merged()
        if not isinstance(source, (Iterable, AsyncIterable)):
            raise TypeError(f"the source must be iterable or async iterable, got {source!r}")
        self._source = source
        self._has_source = True
        self._continuous = bool(continuous)
        return self

    def pipe(
        self,
        op: Callable[[Any], Any] | Any,
        /,
        *,
        concurrency: Concurrency = 1,
        executor: Executor | None = None,
        name: str | None = None,
        output_order: OutputOrder = "completion",
        max_failures: MaxFailures | None = None,
        queue_size: int | None = None,
        max_concurrency: int | None = None,
        initial_concurrency: int | None = None,
        min_concurrency: int | None = None,
    ) -> PipelineBuilder[T, U]:
        """Apply ``op`` to every item.

        A ``None`` result is dropped (as in SPDL). Sync ops run on ``concurrency`` worker
        threads of their own, or are handed to ``executor`` with at most ``concurrency``
        items in flight; async ops run on the pipeline's event loop as ``concurrency``
        coroutines. An ``int`` concurrency is always used exactly; ``"auto"`` lets the
        pipeline choose and adapt it while running, within ``build``'s ``cpu_budget`` and
        ``memory_limit``.

        Args:
            op: takes one argument: a function, an async function, a generator or an async
                generator (each yielded value becomes an item), a callable object, or a
                container with ``__getitem__``.
            concurrency: how many workers run ``op`` at once, or ``"auto"``.
            executor: a ``ThreadPoolExecutor`` (a dedicated thread) or
                ``ProcessPoolExecutor`` (processes) to run a sync ``op`` on; an async op
                takes none.
            name: the stage's name in stats, traces and errors (default: the op's name).
            output_order: ``"completion"`` emits results as they finish; ``"input"``
                keeps the input order.
            max_failures: a failure limit of this stage's own, counted on its items alone,
                instead of sharing the one given to :meth:`build`: an ``int`` count (-1:
                no limit) or a ``fractions.Fraction`` rate in (0, 1] (see :meth:`build`).
            queue_size: the capacity of this stage's input queue.
            max_concurrency: with ``"auto"``, the most it may grow to (default 64
                threads, 256 coroutines).
            initial_concurrency: with ``"auto"``, where it starts (default: where the
                tuner left this stage in the last build of this builder in this process,
                else 4, so that its first items, which the tuner measures, come quickly).
            min_concurrency: with ``"auto"``, the least it runs (default 1; a floor makes
                ``"auto"`` only ever add to a known-good value).
        """
        _, kind = classify_op(op)
        if concurrency != "auto" and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"concurrency must be a positive int or 'auto', got {concurrency!r}")
        for knob, value, role in (
            ("max_concurrency", max_concurrency, "bounds an autotuned stage"),
            ("initial_concurrency", initial_concurrency, "is where an autotuned stage starts"),
            ("min_concurrency", min_concurrency, "is the least an autotuned stage runs"),
        ):
            if value is None:
                continue
            if concurrency != "auto":
                raise ValueError(
                    f"{knob} {role}: it needs concurrency='auto', got concurrency={concurrency!r}"
                )
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{knob} must be a positive int, got {value!r}")
        if (
            min_concurrency is not None
            and max_concurrency is not None
            and isinstance(min_concurrency, int)
            and min_concurrency > max_concurrency
        ):
            raise ValueError(
                f"min_concurrency ({min_concurrency}) is above max_concurrency ({max_concurrency})"
            )
        if output_order not in ("completion", "input"):
            raise ValueError(f"output_order must be 'completion' or 'input', got {output_order!r}")
        if executor is not None and kind.is_async:
            raise ValueError(
                f"op {op_name(op)!r} is async: it runs on the pipeline's event loop, "
                "so it takes no executor"
            )
        if queue_size is not None and (not isinstance(queue_size, int) or queue_size < 1):
            raise ValueError(f"queue_size must be a positive int, got {queue_size!r}")
        if max_failures is not None:
            check_max_failures(max_failures, f"pipe({op_name(op)})")
        self._stages.append(
            PipeConfig(
                op,
                concurrency,
                executor,
                output_order,
                name,
                max_failures,
                queue_size,
                max_concurrency,
                initial_concurrency,
                min_concurrency=min_concurrency,
            )
        )
        return self

    def aggregate(
        self, num_items: int | Aggregator, /, *, drop_last: bool = False
    ) -> PipelineBuilder[T, U]:
        """Group every ``num_items`` items into a list (the last one may be shorter).

        Args:
            num_items: the size of each list, or an
                :class:`~torch_spdl.pipeline.defs.Aggregator` that decides the groups
                (each build uses a copy of it).
            drop_last: drop the shorter last list (for an aggregator: do not call its
                ``flush()``).
        """
        self._stages.append(aggregate_config(num_items, drop_last=drop_last))
        return self

    def path_variants(
        self,
        router: Callable[[Any], Any],
        paths: Sequence[Sequence[Any]],
        name: str | None = None,
    ) -> PipelineBuilder[T, U]:
        """Send each item down one of several paths, then join the paths' outputs.

        Args:
            router: takes an item, returns the index of its path (a function or an async
                function); an error or an index out of range fails the item.
            paths: each a sequence of stages made by ``defs.Pipe``, ``defs.Aggregate``,
                ``defs.Disaggregate`` or ``defs.PathVariants``; each runs as a pipeline
                of its own, and their outputs come out in completion order.
            name: the stage's name in stats and errors.
        """
        self._stages.append(PathVariantsConfig(router, tuple(tuple(p) for p in paths), name))
        return self

    def to(self, target: Any, /) -> PipelineBuilder[T, U]:
        """Run the stages that follow on ``target``, until the next ``to()``.

        ``to(defs.ProcessPoolExecutorConfig(max_workers=n))`` opens a region: its stages
        run as one pipeline in each of ``n`` worker processes (started by ``fork`` on
        Linux, so their ops need not pickle), and only the region's inputs and outputs
        cross the process boundary, in chunks. ``to(defs.MAIN_PROCESS)`` closes it (a
        region left open runs to the end). Stages in a region take no executor.

        ``to(RayActors(num_actors=n, **actor_options))`` runs the region in ``n`` Ray
        actors instead, placed by Ray's actor options anywhere in a cluster: chunks of
        items go to them as actor calls and their outputs come back in the order sent;
        a dead actor is replaced and its chunks run again; every actor is killed as the
        pipeline stops. Its ops must pickle (cloudpickle); it takes no ``aggregate``.

        Args:
            target: a ``ProcessPoolExecutorConfig``, ``RayActors`` or ``MAIN_PROCESS``.
        """
        self._stages.append(PlacementConfig(target))
        return self

    def disaggregate(self) -> PipelineBuilder[T, U]:
        """Split each incoming list (any iterable) into separate items."""
        self._stages.append(DisaggregateConfig())
        return self

    def add_sink(self, buffer_size: int = 3) -> PipelineBuilder[T, U]:
        """Set the size of the output buffer the consumer reads from.

        Args:
            buffer_size: the most finished items waiting for the consumer (0: unbounded).
        """
        if self._buffer_size is not None:
            raise ValueError("the sink is already set")
        if not isinstance(buffer_size, int) or buffer_size < 0:
            raise ValueError(f"buffer_size must be a non-negative int, got {buffer_size!r}")
        self._buffer_size = buffer_size
        return self

    def add_stoppable(self, part: StoppablePart) -> PipelineBuilder[T, U]:
        """Make ``part`` a part of every run built from this declaration: something the
        source or a stage waits on outside the pipeline (a bound on what is in flight,
        threads or processes that feed it), which the run shuts down as it stops, before
        joining its threads (see :class:`StoppablePart`).

        Args:
            part: has a ``shutdown()`` that ends every wait on it.
        """
        if not callable(getattr(part, "shutdown", None)):
            raise TypeError(f"add_stoppable needs an object with shutdown(), got {part!r}")
        self._parts.append(part)
        return self

    def get_config(self) -> PipelineSpec:
        """The declaration so far, as data: a :class:`PipelineSpec` (what
        ``build_pipeline``, ``profile_pipeline`` and ``run_pipeline_in_subprocess`` take;
        SPDL's ``defs.PipelineConfig`` is the other way to declare one)."""
        if not self._has_source:
            raise RuntimeError("the source is not set: call add_source() first")
        buffer_size = 3 if self._buffer_size is None else self._buffer_size
        return PipelineSpec(
            self._source, list(self._stages), buffer_size, self._continuous, list(self._parts)
        )

    def build(
        self,
        *,
        num_threads: int | None = None,
        max_failures: MaxFailures = -1,
        report_stats_interval: float = -1,
        queue_size: int | None = None,
        cpu_budget: float | None = None,
        memory_limit: int | None = None,
        trace: bool = False,
        task_hook_factory: Callable[[StageInfo], list[TaskHook]] | None = None,
        stage_id: int = 0,
        background_tasks: Sequence[BackgroundTaskFactory] = (),
        queue_class: type[AsyncQueue] | None = None,
        use_thread_output_queue: Any = None,
    ) -> Pipeline[U]:
        """Instantiate a fresh pipeline; nothing runs until it is started or iterated.

        The keywords become one :class:`BuildOptions` (in :func:`build_pipeline`).

        Args:
            num_threads: caps each sync stage's worker threads (stages never share
                threads; default: no cap).
            max_failures: how many failed items the pipeline may drop before it fails,
                counted across every stage that does not set its own in :meth:`pipe`: an
                ``int`` count (-1: no limit), or a ``fractions.Fraction`` rate in (0, 1],
                failures / items taken by those stages, checked once they have taken at
                least ``max(100, 1/rate)`` items (and when they end); a rate out of range
                is a ``ValueError`` here.
            report_stats_interval: when > 0, log the stage table every that many seconds.
            queue_size: the capacity of the queues between stages (default: 64 samples,
                or 2 per worker for batches).
            cpu_budget: the fraction of this machine's cores that stages with
                ``concurrency="auto"`` may grow to use (default 0.4).
            memory_limit: the resident bytes those stages may grow to (default: none).
            trace: record every item's time in every stage and the queue depths; read
                them with :meth:`Pipeline.trace`.
            task_hook_factory: makes each stage's :class:`TaskHook` list from its
                :class:`StageInfo` (default: no hooks, and no cost).
            stage_id: passed to ``task_hook_factory`` in each :class:`StageInfo`.
            background_tasks: factories of :class:`BackgroundTask`: each runs on the
                pipeline's event loop from start to stop; a failure is logged, not raised.
            queue_class: a subclass of :class:`AsyncQueue` (such as :class:`StatsQueue`)
                that observes every queue between stages: one instance per queue, its
                ``stage_hook()`` held from start to stop, and every hand-off reported to
                it (default: none, and no cost).
            use_thread_output_queue: accepted for SPDL code: the consumer always reads
                the sink from its own thread here, which is what it selects in SPDL.
        """
        return build_pipeline(
            self.get_config(),
            num_threads=num_threads,
            max_failures=max_failures,
            report_stats_interval=report_stats_interval,
            queue_size=queue_size,
            cpu_budget=cpu_budget,
            memory_limit=memory_limit,
            trace=trace,
            task_hook_factory=task_hook_factory,
            stage_id=stage_id,
            background_tasks=background_tasks,
            queue_class=queue_class,
            use_thread_output_queue=use_thread_output_queue,
        )

    def __repr__(self) -> str:
        stages = " -> ".join(s.label() for s in self._stages)
        return f"PipelineBuilder(source -> {stages or '(no stage)'} -> sink)"
