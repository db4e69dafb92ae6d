"""How many batches an epoch may hold at once: every bound derived from
``prefetch_factor`` and ``num_workers``, computed once.

torch's loader keeps ``prefetch_factor * num_workers`` batches in flight, and scripts size
their memory by it. Batches are large (a queue of the engine's default 64 held 64 MB of
1 MB batches, more than torch's whole loader), so every place of an epoch that holds whole
batches takes its share of that one total: the worker processes' arenas, the batches a
loading thread is making, the queue before the failure budget, the sink, the consumer's
own batch. :class:`BatchBudget` says how much each gets, so the shapes of
``epoch_shapes.py`` read the bounds rather than derive them again.
"""

from __future__ import annotations

from dataclasses import dataclass

from .epoch_plan import EpochPlan
from .stage_specs import bound

__all__ = ["BatchBudget"]


@dataclass(frozen=True, kw_only=True)
class BatchBudget:
    """The batch bounds of one epoch (see :meth:`of`)."""

    #: Batches each worker may have ready or under way: a worker process's arenas and
    #: sent batches, an iterable dataset's worker thread's queue (``prefetch_factor``).
    per_worker: int
    #: Batches sent to worker processes at once (torch's ``prefetch_factor *
    #: num_workers``); out of order, also the threads that wait for them.
    in_flight: int
    #: The sink's batches where no stage holds whole batches (the per-sample and iterable
    #: shapes): ``in_flight`` less the consumer's own batch, at least one; or the loader's
    #: ``buffer_size`` when it sets one.
    sink: int
    #: ``default_collate``'s recycled buffers: the sink's, one per collate worker, the
    #: consumer's batch, and one spare (pooling every batch a whole-batch shape holds kept
    #: more memory: measured).
    recycled: int
    #: Batches queued before a parallel collate: one per collate worker (at most four
    #: while ``"auto"`` grows it), plus one.
    collate_queue: int
    #: Made batches waiting for the failure budget (``SettleBatch``) on whole-batch shapes.
    settle_queue: int
    #: Whether ``buffer_size`` fixed the sink (then no shape changes it).
    fixed_sink: bool

    @classmethod
    def of(cls, plan: EpochPlan) -> BatchBudget:
        """The bounds of an epoch run under ``plan``."""
        per_worker = plan.prefetch_factor
        in_flight = per_worker * plan.num_workers
        sink = plan.buffer_size or max(in_flight - 1, 1)
        cc = plan.collate_concurrency
        cc_max = bound(cc, "cpu")
        return cls(
            per_worker=per_worker,
            in_flight=in_flight,
            sink=sink,
            recycled=sink + cc_max + 2,
            collate_queue=(min(cc_max, 4) if cc == "auto" else cc_max) + 1,
            settle_queue=2,
            fixed_sink=bool(plan.buffer_size),
        )

    def sink_after(self, holding: int) -> int:
        """The sink of a whole-batch shape, whose ``holding`` loading threads or worker
        arenas each hold a batch already, with the settle queue: what is left of the
        total, at least one batch."""
        if self.fixed_sink:
            return self.sink
        return max(self.in_flight - holding - self.settle_queue - 1, 1)
