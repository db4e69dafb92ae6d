"""Which shape an epoch's pipeline takes, and what the epoch keeps of it.

:class:`EpochParts` turns an :class:`~.epoch_plan.EpochPlan` into a pipeline
declaration: it reads the plan's ``loading`` once, picks the one function of
``epoch_shapes.py`` that declares that shape, and hands it the epoch's one
:class:`~.batch_budget.BatchBudget`. Every wait outside the engine (batch tokens, worker
threads or processes) is registered with the pipeline declared, which shuts it down as it
stops: the epoch only stops its pipeline. Kept across the epoch's pipelines (one, or two
when ``worker_type="auto"`` switches): the worker processes batches come from (the epoch
names them, and tells them which batches were delivered), the probe of
``worker_type="auto"``, and the ``"auto"`` stages of the last declaration (where they
settled is kept for the next epoch). What outlives the epoch it asks of the loader's
:class:`~.epoch_plan.LoaderResources`. The epoch (``epoch.py``) consumes the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...pipeline import StageStats, StoppablePart
from .._loading.batch_workers import BatchWorkers
from .._loading.sample_ops import SkipBudget
from .._loading.staged_batch import staged_steps
from .batch_budget import BatchBudget
from .epoch_executors import EpochExecutors
from .epoch_plan import EpochPlan, LoaderResources, Loading
from .idle_run import IdleRun
from .stage_specs import AutoStages, split_point
from .thread_or_process import WINDOW_BATCHES, Probe, SwitchGate, WorkerChoice

if TYPE_CHECKING:
    from ...pipeline import PipelineBuilder
    from .epoch_shapes import Batches, Declaring

__all__ = ["EpochParts"]


class EpochParts:
    """Declares an epoch's pipelines; keeps what the epoch reads of them.

    Args:
        plan: the epoch's settings.
        resources: what the loader keeps across epochs.
        base_seed: the workers' base seed, drawn by the epoch as torch draws it.
        skips: the epoch's failure budget (shared by every pipeline of the epoch).
        gate: where ``worker_type="auto"`` stops the probing pipeline, when it probes.
    """

    def __init__(
        self,
        plan: EpochPlan,
        resources: LoaderResources,
        base_seed: int,
        skips: SkipBudget,
        gate: SwitchGate | None,
    ) -> None:
        self._plan = plan
        self._resources = resources
        self._skips = skips
        self._gate = gate
        self._budget = BatchBudget.of(plan)
        self._executors = EpochExecutors(plan, resources, base_seed, self._budget)
        #: The worker processes this epoch's batches come from, if any.
        self.loading: BatchWorkers | None = None
        #: ``worker_type="auto"``'s measurements, while it probes.
        self.probe: Probe | None = None
        self._auto = AutoStages(resources)  # the "auto" stages of the last declaration

    @property
    def budget(self) -> BatchBudget:
        """The epoch's batch bounds."""
        return self._budget

    def build_iterable(self, done: int) -> PipelineBuilder[Any, Any]:
        """An iterable dataset's epoch, skipping the ``done`` batches delivered before."""
        from .epoch_shapes import iterable_shape  # declaring loads the engine: see _declaring

        plan = self._plan
        with_processes = plan.worker_type in ("process", "ray") and self._executors.any
        processes = self._processes(drop_buffers=False) if with_processes else None
        return iterable_shape(self._declaring(done, set()), processes)

    def build_map(
        self, loading: Loading, batches: Batches, done: int, extra: set[int]
    ) -> PipelineBuilder[Any, Any]:
        """The pipeline of a map-style epoch for ``loading`` over ``batches``, when
        batches ``[0, done)`` and ``extra`` were delivered."""
        from .epoch_shapes import batch_shape, inline_shape, process_shape, sample_shape

        plan = self._plan
        d = self._declaring(done, extra)
        if loading == "inline":
            return inline_shape(d, batches)
        if loading == "staged":
            split = split_point(plan.dataset, plan.worker_type, plan.num_workers)
            if split is None:
                return sample_shape(d, None, batches)
            if staged_steps(plan.dataset) is not None:  # io stages first: all in the workers
                return process_shape(d, *self._processes(), batches, split=None)
            return process_shape(d, *self._processes(), batches, split=split)
        if loading == "probe":
            self.probe = Probe(min(WINDOW_BATCHES, plan.threads))
            return batch_shape(d, plan.threads, batches, probe=self.probe, gate=self._gate)
        assert isinstance(loading, WorkerChoice), f"a map-style epoch needs a plan: {loading}"
        if loading.kind == "process":
            return process_shape(d, *self._processes(), batches, split=None)
        if loading.per_batch:
            return batch_shape(d, loading.threads, batches)
        return sample_shape(d, loading.threads, batches)

    def build_caller(self) -> tuple[BatchWorkers, IdleRun]:
        """The worker processes of an epoch whose batches the calling thread sends and
        reads itself (``caller.WorkerFeed``), and their owner: stopping it shuts them
        down, as stopping a pipeline shuts down those it runs with. The caller forks them
        (``ProcessWorkers.start``): from its frame, the workers inherit a stack as short
        as torch's workers do (why that matters: ``ProcessWorkers.start``)."""
        workers, stopper = self._processes(receiver=False, start=False)
        return workers, IdleRun(stopper)

    def record_tuning(self, stats: Sequence[StageStats]) -> None:
        """Keep where the last pipeline's ``"auto"`` stages settled, for the next epoch."""
        self._auto.record(stats)

    def _declaring(self, done: int, extra: set[int]) -> Declaring:
        """What the shapes read for one declaration (``extra``: copied, as delivering
        batches changes the live set). ``epoch_shapes`` is imported here and by the two
        ``build_`` methods, not with this module: it declares pipelines, which loads the
        engine, and the epochs that ``next()`` drives (torch's default shape) never do."""
        from .epoch_shapes import Declaring

        self._auto = AutoStages(self._resources)
        return Declaring(
            self._plan,
            self._resources,
            self._executors,
            self._budget,
            self._skips,
            self._auto,
            done=done,
            delivered=frozenset(extra),
        )

    def _processes(
        self, *, receiver: bool = True, drop_buffers: bool = True, start: bool = True
    ) -> tuple[BatchWorkers, StoppablePart]:
        """This epoch's worker processes and what stops them with the pipeline, forked
        unless ``start`` is False. The buffers kept for batches collated on threads go
        first (``drop_buffers``): every worker would inherit them."""
        if drop_buffers:
            self._resources.drop_recycled_buffers()
        workers, stopper = self._executors.processes(receiver=receiver)
        self.loading = workers
        if start:
            try:
                workers.start()
            except BaseException:  # no pipeline owns them yet
                stopper.shutdown()
                raise
        return workers, stopper
