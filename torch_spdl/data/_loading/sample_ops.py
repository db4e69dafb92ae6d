"""Per-sample ops of a DataLoader epoch: slots, stage wrappers, rebatch, collate.

Every sample travels as a :class:`Slot` (its batch number and place in the batch). A
stage that fails does not raise into the engine: it records the error on the slot, and
``rebatch`` decides, in batch order, whether the sample is skipped (within the failure
budget) or the batch carries the error to the consumer, which raises it when that batch's
turn comes: every batch before it is still delivered, as with torch.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .worker_info import WorkerGroup, hidden_worker_info, single_threaded_ops

__all__ = [
    "BatchError",
    "CollateOrError",
    "SkipBudget",
    "Rebatch",
    "RebatchCollate",
    "Slot",
    "settle",
    "Tagged",
    "Tokens",
    "SlotSource",
    "stage_op",
    "load_inline",
]

_LG = logging.getLogger("torch_spdl.data")


class Slot:
    """A sample on its way through the stages: which batch, which place, its value."""

    __slots__ = ("batch", "size", "pos", "index", "value", "error")

    def __init__(self, batch: int, size: int, pos: int, index: Any) -> None:
        self.batch = batch
        self.size = size
        self.pos = pos
        self.index = index
        self.value: Any = index
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        return f"sample(index={self.index!r}, batch={self.batch})"


class BatchError:
    """Stands in for a batch whose loading failed; the consumer raises ``error``. The epoch
    goes on after it (as torch's does), unless it is ``fatal`` (a worker process died)."""

    __slots__ = ("error", "fatal")

    def __init__(self, error: BaseException, *, fatal: bool = False) -> None:
        self.error = error
        self.fatal = fatal


def _note(exc: BaseException, stage: str, slot: Slot, where: str = "") -> BaseException:
    exc.add_note(
        f"torch_spdl.DataLoader: stage {stage!r} failed on sample index {slot.index!r}{where}"
    )
    return exc


def stage_op(
    fn: Callable[[Any], Any], name: str, group: WorkerGroup | None
) -> Callable[[Slot], Any]:
    """One step of ``__getitem__`` as a pipeline op on slots (sync or async like ``fn``)."""
    if inspect.iscoroutinefunction(fn):

        async def run_async(slot: Slot) -> Slot:
            if slot.error is None and slot.size:
                try:
                    slot.value = await fn(slot.value)
                except Exception as exc:
                    slot.error = _note(exc, name, slot)
            return slot

        return run_async

    def run(slot: Slot) -> Slot:
        if slot.error is None and slot.size:  # size 0: the stand-in of an empty batch
            single_threaded_ops()
            call = fn
            if group is not None:
                group.enter()
                call = group.local(fn)  # bound to the thread's copy of the dataset
            try:
                slot.value = call(slot.value)
            except Exception as exc:
                slot.error = _note(exc, name, slot)
        return slot

    return run


class SkipBudget:
    """How many samples may fail and be skipped before an error reaches the caller
    (``max_failures``). Spending it skips one sample and the epoch goes on; once spent,
    the failing batch carries its error to the consumer. (The engine's ``FailureLimit``
    counts failed items too, but fails the whole pipeline when it is exceeded.)"""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.count = 0

    def spend(self) -> bool:
        if self.count >= self.allowed:
            return False
        self.count += 1
        return True


class Tokens:
    """Bounds the batches between the source and the end of ``rebatch``.

    The per-sample stages run in completion order (cheap with many threads) and
    ``rebatch`` restores the batch order; without this bound, one stalled sample would let
    the source run arbitrarily far ahead while later batches pile up behind it.
    """

    def __init__(self, count: int) -> None:
        self._sem = threading.Semaphore(count)
        self._closed = False

    def take(self) -> bool:
        self._sem.acquire()
        return not self._closed

    def give(self) -> None:
        self._sem.release()

    def shutdown(self) -> None:
        """The pipeline stops (the tokens are a part of it, ``add_stoppable``): the one
        source thread may be waiting, wake it to see that it must end."""
        self._closed = True
        self._sem.release()


_MISSING: Any = object()


class Rebatch:
    """Regroups samples into the batches the sampler made, yielding ``(batch number,
    samples or BatchError)``; in sampler order when ``ordered``. Runs on one thread."""

    def __init__(
        self,
        tokens: Tokens,
        budget: SkipBudget,
        first: int,
        skip: set[int],
        *,
        ordered: bool,
        with_index: bool = False,
    ) -> None:
        self._with_index = with_index  # samples as (index, value) pairs
        self._tokens = tokens
        self._budget = budget
        self._ordered = ordered
        self._next = first
        self._skip = skip
        self._open: dict[int, list[Any]] = {}
        self._filled: dict[int, int] = {}
        self._done: dict[int, Any] = {}
        self._advance()

    def _advance(self) -> None:
        while self._next in self._skip:
            self._next += 1

    def __call__(self, slot: Slot) -> Iterator[tuple[int, Any]]:
        b = slot.batch
        samples = self._open.get(b)
        if samples is None:
            samples = self._open[b] = [_MISSING] * slot.size
            self._filled[b] = 0
        if slot.size:
            samples[slot.pos] = slot
            self._filled[b] += 1
            if self._filled[b] < slot.size:
                return
        del self._open[b], self._filled[b]
        if not self._ordered:
            self._tokens.give()
            yield from self._finish(b, samples)
            return
        self._done[b] = samples
        while self._next in self._done:
            self._tokens.give()
            yield from self._finish(self._next, self._done.pop(self._next))
            self._next += 1
            self._advance()

    def _finish(self, b: int, slots: list[Slot]) -> Iterator[tuple[int, Any]]:
        item = settle(b, slots, self._budget, with_index=self._with_index)
        if item is not None:
            yield item


def settle(
    b: int, slots: list[Slot], budget: SkipBudget, *, with_index: bool = False
) -> tuple[int, Any] | None:
    """Batch ``b`` from its samples: failed ones skipped within the budget (in batch order,
    so deterministically), else the batch carries the first error past it; None when
    every sample failed and was skipped."""
    values = []
    for slot in slots:
        if slot.error is None:
            values.append((slot.index, slot.value) if with_index else slot.value)
        elif budget.spend():
            _LG.warning("skipped %r: %s", slot, slot.error)
        else:
            return b, BatchError(slot.error)
    if slots and not values:
        _LG.warning("skipped batch %d: every sample in it failed", b)
        return None
    return b, values


class CollateOrError:
    """``collate_fn`` as a stage on one batch; a failure becomes a BatchError naming the
    batch, delivered in its turn. (The engine's ``Collate`` is another thing: the
    aggregator that groups items into lists of ``n``.)"""

    def __init__(self, collate_fn: Callable[[Any], Any], *, auto: bool, tagged: bool) -> None:
        self.collate_fn = collate_fn
        self.auto = auto
        self.tagged = tagged

    def __call__(self, item: Any) -> Any:
        b, samples = item if self.tagged else (None, item)
        if isinstance(samples, BatchError):
            return item
        single_threaded_ops()
        try:
            with hidden_worker_info():
                batch = self.collate_fn(samples if self.auto or not self.tagged else samples[0])
        except Exception as exc:
            where = f" on batch {b}" if b is not None else ""
            exc.add_note(f"torch_spdl.DataLoader: stage 'collate' failed{where}")
            batch = BatchError(exc)
        return (b, batch) if self.tagged else batch


class RebatchCollate:
    """Rebatch and collate fused in one stage (one thread hop fewer per batch)."""

    def __init__(self, rebatch: Rebatch, collate: CollateOrError) -> None:
        self.rebatch = rebatch
        self.collate = collate

    def __call__(self, slot: Slot) -> Iterator[Any]:
        for item in self.rebatch(slot):
            yield self.collate(item)


class load_inline:  # noqa: N801 (used as a function: it names what the source does)
    """``num_workers=0``: sample, load, batch and collate on the source's thread (like
    torch's single-process loading, but in the background), so each batch crosses one
    thread boundary, not each sample. It ends when its slots do."""

    def __init__(self, samples: SlotSource, getitem: Callable[[Slot], Slot], fused: RebatchCollate):
        self._samples = samples
        self._getitem = getitem
        self._fused = fused

    def __iter__(self) -> Iterator[Any]:
        for slot in self._samples:
            yield from self._fused(self._getitem(slot))


class Tagged:
    """Applies ``fn`` to the batch of a ``(batch number, batch)`` pair (or a bare batch)."""

    def __init__(self, fn: Callable[[Any], Any], *, tagged: bool) -> None:
        self.fn = fn
        self.tagged = tagged

    def __call__(self, item: Any) -> Any:
        b, batch = item if self.tagged else (None, item)
        if not isinstance(batch, BatchError):
            batch = self.fn(batch)
        return (b, batch) if self.tagged else batch


class SlotSource:
    """Per-sample slots of ``(batch number, indices)`` pairs (without auto-collation, each
    "batch" is one index, alone in its list): the source of a per-sample pipeline.

    It waits for a token before each batch; the tokens are a part of the pipeline
    (``PipelineBuilder.add_stoppable``), which ends that wait as it stops, so that no
    source thread outlives the epoch (a loader dropped at interpreter exit, say)."""

    def __init__(self, batches: Iterator[tuple[int, list[Any]]], tokens: Tokens) -> None:
        self._batches = batches
        self._tokens = tokens

    def __iter__(self) -> Iterator[Slot]:
        for b, indices in self._batches:
            if not self._tokens.take():
                return
            size = len(indices)
            if size == 0:
                yield Slot(b, 0, 0, None)  # an empty batch still goes to collate_fn, as in torch
            for pos, index in enumerate(indices):
                yield Slot(b, size, pos, index)
