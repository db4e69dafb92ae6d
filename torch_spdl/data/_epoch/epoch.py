"""One epoch of a DataLoader: makes its batches, tracks what was delivered.

The loader hands the epoch an :class:`~.epoch_plan.EpochPlan` (its settings, frozen) and
its :class:`~.epoch_plan.LoaderResources` (what outlives the epoch). The batches come
either from ``next()`` itself (:mod:`.caller`: torch's default shapes, worker processes
fed and read by the calling thread, or loading inline with ``num_workers=0``) or from a
pipeline declared by :class:`~.epoch_pipeline.EpochParts` (a staged dataset, worker
threads, ``in_order=False``, pinning or moving batches). Here: the epoch's random draws,
the batches it delivered (for ``state_dict``), the errors it raises, and its end. Either
way the epoch holds one owner of every wait of the epoch outside the engine (batch
tokens, worker threads and processes): the pipeline, or where ``next()`` makes the
batches, an :class:`~.idle_run.IdleRun` (owning the worker processes the caller feeds,
if any). Ending the epoch is stopping it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ...pipeline import PipelineFailure
from .._loading.fetch import is_stateful
from .._loading.sample_ops import BatchError, SkipBudget
from .._workers.iterable_processes import WorkerStates, caller_feed
from .._workers.libc import trim
from .batch_ops import batch_tasks
from .batch_transfer import BatchMover
from .caller import CallerLoading, Feed, WorkerFeed, inline_iterable, inline_map
from .epoch_pipeline import EpochParts
from .epoch_plan import EpochPlan, LoaderResources, warn_past_reported_length
from .idle_run import IdleRun
from .thread_or_process import SwitchGate, WorkerChoice, decide

if TYPE_CHECKING:
    from ...pipeline import Pipeline
    from .epoch_shapes import Batches

__all__ = ["EpochIterator", "rng_state", "set_rng_state"]


_END: Any = object()
# How long stopping an epoch waits for its threads. A thread stuck in user code (a read
# that never returns) cannot be interrupted in Python: it is left to finish on its own
# (a daemon thread, reported in the log), so that it never delays an error, a timeout or
# the end of a loop that broke off.
_ABANDON_S = 0.1


def rng_state(gen: torch.Generator | None) -> torch.Tensor:
    """The state of the loader's generator, or of torch's global RNG without one."""
    return gen.get_state() if gen is not None else torch.get_rng_state()


def set_rng_state(gen: torch.Generator | None, state: torch.Tensor) -> None:
    """Restore what :func:`rng_state` returned."""
    if gen is not None:
        gen.set_state(state)
    else:
        torch.set_rng_state(state)


class EpochIterator:
    """Iterator over one epoch's batches. Nothing in the pipeline refers back to it, so
    dropping it stops the pipeline at once.

    Args:
        plan: the loader's settings for this epoch.
        resources: what the loader keeps across epochs.
        resume: a ``state_dict`` of this epoch taken before, to deliver exactly the rest.
    """

    def __init__(
        self, plan: EpochPlan, resources: LoaderResources, resume: dict[str, Any] | None
    ) -> None:
        self._plan = plan
        self._resources = resources
        self._map_style = plan.map_style
        self._closed = False
        self._exhausted = False
        gen = plan.generator
        if resume is not None:  # replay the epoch's random draws
            set_rng_state(gen, resume["rng_state"])
        self._rng_state = rng_state(gen)
        self._watermark: int = resume["delivered"] if resume else 0  # batches [0, w) delivered
        self._extra: set[int] = set(resume["extra"]) if resume else set()
        # A stateful IterableDataset's own position (``_loading.fetch.is_stateful``): in this
        # process (no workers), or as each worker process last reported it.
        self._stateful = not self._map_style and is_stateful(plan.dataset)
        self._worker_states = WorkerStates()
        restore = None
        if self._stateful and resume is not None and "dataset_states" in resume:
            restore = WorkerStates(resume["dataset_states"], resume["next_worker"])
        if self._stateful and resume is not None and "dataset_state" in resume:
            plan.dataset.load_state_dict(resume["dataset_state"])
        if self._map_style:
            # torch's own iteration of the sampler: the training process allocates (and
            # frees) exactly what torch's loader does, which scripts' speed depends on
            indices = iter(plan.index_sampler)
        # torch draws the workers' base seed from the same generator right after making the
        # sampler iterator; doing the same keeps the sampler's draws identical to torch's.
        # Persistent workers are seeded once: torch draws it for the epoch that starts them
        # and not again (its iterator is reset, not made anew), so neither do we.
        base_seed = resources.worker_seed if plan.persistent_workers else None
        if base_seed is None:
            base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
            if plan.persistent_workers and plan.num_workers > 0:
                resources.worker_seed = base_seed
        self._skips = SkipBudget(plan.max_failures)
        # before the source: it stops where the plan changes
        self._gate = SwitchGate() if plan.loading == "probe" else None
        self._parts = EpochParts(plan, resources, base_seed, self._skips, self._gate)
        # The sampler's own draws happen in iter(), in this thread. With worker processes
        # that next() feeds, after they fork, as torch's do: they start while a large
        # sampler makes its permutation (2M indices: 100 ms), and fork without it.
        fork_first = self._map_style and _fed_by_caller(plan)
        if self._map_style and not fork_first:
            self._draw_first(indices)
        self._timeout = plan.timeout
        self._yielded = 0  # batches delivered, counted only against a reported length
        self._caller: CallerLoading | None = None
        self._pipeline: Pipeline[Any] | IdleRun = self._first_loading(
            restore, indices if fork_first else None
        )
        # The pipeline starts at the first next(), as torch's single-process iterator does:
        # code that calls iter() twice on a loader whose batch sampler is its own iterator
        # (Lightning's predict loop does) must not have the unused first epoch pull from it.
        # It is read with get_item, not its iterator, so that this epoch decides how long
        # stopping it waits (``_ABANDON_S``). Stopping it shuts down what it owns: the
        # batch tokens, worker threads or processes (``PipelineBuilder.add_stoppable``).

    def _draw_first(self, indices: Iterator[Any]) -> None:
        first = next(indices, _END)
        self._chosen = _chain(first, indices)

    def _first_loading(
        self, restore: WorkerStates | None, undrawn: Iterator[Any] | None
    ) -> Pipeline[Any] | IdleRun:
        """Where the batches come from: ``next()`` itself (``self._caller``; what is
        returned then is an :class:`IdleRun`, the owner of the worker processes the caller
        feeds, if any) or the pipeline returned. ``undrawn``: the sampler's iterator, to
        draw from once the worker processes that next() feeds have forked."""
        plan = self._plan
        iterable_inline = not self._map_style and plan.num_workers == 0
        if plan.loading == "caller" or (
            iterable_inline and plan.worker_type in ("process", "ray")
        ):
            batches = self._batches(0) if self._map_style else None
            feed = _inline_feed(plan, batches, self._watermark, stateful=self._stateful)
            self._caller = _caller_loading(plan, self._skips, feed)
            return IdleRun()
        if _fed_by_caller(plan):
            workers, idle = self._parts.build_caller()  # from now on they have an owner
            budget = self._parts.budget
            try:
                # Forked from this frame, not deeper: a worker's __getitem__ then has a
                # frame fewer under it than under torch's loader (ProcessWorkers.start).
                workers.start()
                if undrawn is not None:
                    self._draw_first(undrawn)
            except BaseException:  # a fork or the sampler failed: no worker outlives iter()
                idle.stop(timeout=_ABANDON_S)
                raise
            if self._map_style:
                feed = WorkerFeed(
                    workers,
                    self._batches(0),
                    budget.in_flight,
                    plan.timeout,
                    own_workers=not plan.persistent_workers,
                )
            else:
                feed = caller_feed(
                    workers,
                    budget.per_worker,
                    self._watermark,
                    plan.timeout,
                    self._worker_states if self._stateful else None,
                    restore,
                )
            self._caller = _caller_loading(plan, self._skips, feed)
            return idle
        if self._map_style:
            builder = self._parts.build_map(
                plan.loading, self._batches(0), self._watermark, self._extra
            )
            return builder.build(max_failures=0)
        return self._parts.build_iterable(self._watermark).build(max_failures=0)

    def _batches(self, first: int) -> Iterator[tuple[int, list[Any]]]:
        # A copy of the restored skip set: delivering batches changes the live one.
        skip = set(self._extra)
        return batch_tasks(
            self._chosen,
            first,
            self._watermark,
            skip,
            auto_collation=self._plan.auto_collation,
            gate=self._gate,
        )

    # -- consuming -------------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return self._plan.length()

    @property
    def _workers(self) -> list[Any]:
        """This epoch's worker processes, as torch's iterator names them (torch's tests and
        some scripts join them, or read their pids); empty without worker processes."""
        loading = self._parts.loading
        return loading.processes if loading is not None else []

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            item = self._get()
        except StopIteration:
            if self._switch():
                return self.__next__()
            self._exhausted = True
            self.close()
            raise
        except TimeoutError as exc:
            self.close()
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from exc
        except PipelineFailure as failure:
            self.close()
            cause = failure.__cause__
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except BaseException:
            self.close()
            raise
        b, batch = item if self._map_style else (None, item)
        if isinstance(batch, BatchError):
            if batch.fatal:
                self.close()
            else:  # the batch is done with (as torch's iterator is): the epoch goes on
                self._delivered(b)
                self._resources.num_failures = self._skips.count
            error = batch.error
            # The traceback keeps this frame: without `self` in it, an error that ends the
            # caller's loop does not keep the epoch (and its workers) running.
            del self, item, batch
            raise error
        self._delivered(b)
        self._resources.num_failures = self._skips.count
        if self._plan.reported_length is not None:
            self._yielded += 1
            if self._yielded > self._plan.reported_length:
                warn_past_reported_length(self._plan, self._yielded)
        return batch

    def _get(self) -> Any:
        if self._caller is not None:
            b, batch = self._caller.next()
            return (b, batch) if self._map_style else batch
        try:
            return self._pipeline.get_item(timeout=self._timeout)
        except EOFError:  # the end, or the stream a failure ended: stop() raises it
            if self._gate is None or self._gate.choice is None:
                self._pipeline.stop(timeout=_ABANDON_S)
            raise StopIteration from None

    def _stop_pipeline(self) -> None:
        """Stop the pipeline; its failure, if any, was raised from ``next()`` already."""
        try:
            self._pipeline.stop(timeout=_ABANDON_S)
        except PipelineFailure:
            pass

    def _switch(self) -> bool:
        """When ``worker_type="auto"`` chose another plan, the probing pipeline has ended:
        the batches it set aside, then the rest of the epoch, go to the new one."""
        gate = self._gate
        if gate is None or gate.choice is None:
            return False
        self._gate = None
        self._parts.record_tuning(self._pipeline.get_stats())  # the next epoch starts there
        self._stop_pipeline()  # every thread of the probing pipeline is joined: fork-safe
        # Its collate buffers must be gone before worker processes fork (they would inherit
        # them); an idle owner of nothing stands in until the next pipeline is built.
        self._pipeline = IdleRun()
        if gate.choice.kind == "process":
            trim()  # what the measuring threads left free, every worker would inherit
        rest: Iterator[tuple[int, list[Any]]] = iter(sorted(gate.deferred))
        if gate.next_batch is not None:
            rest = itertools.chain(rest, self._batches(gate.next_batch))
        builder = self._parts.build_map(gate.choice, rest, self._watermark, self._extra)
        self._pipeline = builder.build(max_failures=0)
        return True

    def _delivered(self, b: int | None) -> None:
        loading = self._parts.loading
        if loading is not None and b is not None:
            loading.delivered(b)  # its arena is the training loop's now
        if b is None or b == self._watermark:
            self._watermark += 1
            while self._watermark in self._extra:
                self._extra.discard(self._watermark)
                self._watermark += 1
        else:
            self._extra.add(b)

    def state_dict(self) -> dict[str, Any]:
        if self._exhausted or _all_delivered(self._plan, self._watermark):
            # The epoch is over: what matters is the RNG state the next epoch starts from.
            end = rng_state(self._plan.generator)
            return {"epoch": self._plan.epoch, "rng_state": end, "exhausted": True}
        state: dict[str, Any] = {
            "epoch": self._plan.epoch,
            "rng_state": self._rng_state,
            "delivered": self._watermark,
            "extra": sorted(self._extra),
            "exhausted": False,
        }
        if self._stateful and self._plan.num_workers == 0:
            state["dataset_state"] = self._plan.dataset.state_dict()
        elif self._stateful and self._worker_states.states:
            state["dataset_states"] = dict(self._worker_states.states)
            state["next_worker"] = self._worker_states.next_worker
        return state

    def close(self) -> None:
        """Stop this epoch's pipeline now (and with it, what it owns: worker threads or
        processes); the iterator then ends."""
        if self._closed:
            return
        self._closed = True
        self._parts.record_tuning(self._pipeline.get_stats())  # the next epoch starts there
        self._stop_pipeline()
        plan = self._plan
        probe = self._parts.probe
        resources = self._resources
        if probe is not None and not probe.done and resources.worker_choice is None:
            # An epoch too short to decide in: decide for the next one from what it saw.
            measured = probe.final()
            if measured is not None and measured.batches >= probe.min_batches:
                more = plan.worker_init_fn is None
                size = plan.batch_size or 1
                resources.chose(decide(measured, plan.num_workers, size, more_threads=more))

    def __del__(self) -> None:
        if hasattr(self, "_pipeline"):
            self.close()


def _fed_by_caller(plan: EpochPlan) -> bool:
    """Whether ``next()`` sends and reads the worker processes' batches itself, as
    torch's does (``caller.py``): plain worker processes, batches in order, nothing to
    pin or move (torch pins on a thread of its own; so does the pipeline)."""
    if plan.map_style:
        loading = plan.loading
        processes = isinstance(loading, WorkerChoice) and loading.kind == "process"
    else:  # an IterableDataset: its worker_type says how
        processes = plan.worker_type in ("process", "ray") and plan.num_workers > 0
    mover = BatchMover(plan.device, pin_memory=plan.pin_memory)
    return processes and plan.in_order and not mover.active


def _inline_feed(
    plan: EpochPlan, batches: Batches | None, watermark: int, *, stateful: bool
) -> Feed:
    """Batches loaded inside ``next()`` with no worker (``batches``: a map-style
    dataset's; an iterable one skips the ``watermark`` batches delivered before, unless
    its ``stateful`` dataset restored its own position)."""
    if batches is not None:
        return inline_map(
            plan.dataset, batches, plan.collate_fn, auto_collation=plan.auto_collation
        )
    per_batch = plan.batch_size if plan.auto_collation else None
    return inline_iterable(
        plan.dataset,
        per_batch,
        plan.collate_fn,
        drop_last=plan.drop_last,
        auto_collation=plan.auto_collation,
        skip=watermark,
        restored=stateful and watermark > 0,
    )


def _caller_loading(plan: EpochPlan, skips: SkipBudget, feed: Feed) -> CallerLoading:
    """Batches made inside ``next()``, driven by the caller's thread (``caller.py``)."""
    return CallerLoading(
        feed,
        skips,
        plan.collate_fn,
        auto_collation=plan.auto_collation,
        mover=BatchMover(plan.device, pin_memory=plan.pin_memory),
    )


def _all_delivered(plan: EpochPlan, watermark: int) -> bool:
    """Whether a map-style epoch delivered every batch of its sampler."""
    if not plan.map_style:
        return False
    try:
        return watermark >= len(plan.index_sampler)
    except TypeError:
        return False


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    """``first`` then the rest of ``rest``, without calling ``iter(rest)`` again: a batch
    sampler that is its own iterator (Lightning's) restarts when iterated anew."""
    if first is _END:
        return
    yield first
    while (item := next(rest, _END)) is not _END:
        yield item
