"""Per-batch ops of a DataLoader epoch: for samples loaded a whole batch at a time.

``batch_tasks`` feeds the batches the sampler chose (those not yet delivered); each is
loaded whole by :class:`LoadInThreads` (on a thread, measuring it while
``worker_type="auto"`` decides) or :class:`SendToWorkers` (sent to its worker process by one
thread, in order, and waited for by others), then :class:`SettleBatch` applies the failure budget as
the per-sample path's ``rebatch`` does, and collates what is left of a batch in which some
samples failed (the loader of the batch could not know whether the budget allows skipping
them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .._loading.batch_workers import BatchWorkers
from .._loading.fetch import Fetched, fetch_batch
from .._loading.sample_ops import BatchError, SkipBudget, Slot, settle
from .._loading.worker_info import WorkerGroup, single_threaded_ops
from .thread_or_process import Probe, SwitchGate, WorkerChoice, clock, decide

__all__ = [
    "LoadInThreads",
    "SendToWorkers",
    "SettleBatch",
    "batch_tasks",
    "receive_from_workers",
]


def batch_tasks(
    chosen: Iterator[Any],
    first: int,
    done: int,
    skip: set[int],
    *,
    auto_collation: bool,
    gate: SwitchGate | None = None,
) -> Iterator[tuple[int, list[Any]]]:
    """``(batch number, indices)`` for every batch not yet delivered, numbered from
    ``first`` (batches ``< done`` and in ``skip`` were delivered before a restore). Stops
    at the first batch after ``gate`` switched plans, setting it aside for the next one."""
    for b, indices in enumerate(chosen, first):
        if b < done or b in skip:
            continue
        item = (b, list(indices) if auto_collation else [indices])
        if gate is not None and gate.switched:
            gate.start(b, item)  # set aside: it is past the cut
            gate.next_batch = b + 1
            return
        yield item


class LoadInThreads:
    """A pipeline op: batch ``b`` loaded and collated whole on the calling thread.

    With a ``probe``, the first batches are measured until :func:`decide` can choose a
    plan; ``on_choice`` is then told, and when the plan differs from this one, ``gate``
    sets the batches not yet started aside for it."""

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        group: WorkerGroup | None,
        *,
        auto_collation: bool,
        probe: Probe | None = None,
        gate: SwitchGate | None = None,
        on_choice: Callable[[WorkerChoice], None] | None = None,
        current: WorkerChoice | None = None,
        batch_size: int = 1,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.group = group
        self.probe = probe
        self.gate = gate
        self.on_choice = on_choice
        self.current = current
        self.batch_size = batch_size

    def __call__(self, item: tuple[int, list[Any]]) -> tuple[int, Fetched] | None:
        b, indices = item
        if self.gate is not None and not self.gate.start(b, item):
            return None  # the next plan loads it
        single_threaded_ops()
        if self.group is not None:
            self.group.enter()
        probe = self.probe
        if probe is None or probe.done:
            return b, self._fetch(indices)
        t0, c0 = clock()
        probe.started(t0)
        fetched = self._fetch(indices)
        t1, c1 = clock()
        probe.record(len(indices), t1 - t0, c1 - c0, t1, tensor_bytes(fetched.batch))
        measured = probe.measurement()
        if measured is not None and not probe.done:
            probe.done = True
            group = self.group
            workers = group.num_workers if group is not None else 1
            more = group is None or group.init_fn is None
            self.choose(decide(measured, workers, self.batch_size, more_threads=more))
        return b, fetched

    def choose(self, choice: WorkerChoice) -> None:
        if self.on_choice is not None:
            self.on_choice(choice)
        current = self.current
        same = current is not None and (choice.kind, choice.threads, choice.per_batch) == (
            current.kind,
            current.threads,
            current.per_batch,
        )
        if not same and self.gate is not None:
            self.gate.switch(choice)

    def _fetch(self, indices: list[Any]) -> Fetched:
        group = self.group
        dataset = self.dataset if group is None else group.local_dataset()
        return fetch_batch(dataset, indices, indices, None, self.collate_fn, self.auto_collation)


class SendToWorkers:
    """A pipeline op on one thread, in batch order: batch ``b`` sent to worker process
    ``b % n``, as a future of what it made.

    Its input is ``(b, indices)`` (the worker runs ``__getitem__``), or, after stages that
    ran on threads, ``(b, [(index, value), ...])`` with ``split`` naming the first stage
    the worker runs."""

    def __init__(self, workers: BatchWorkers, split: int | None) -> None:
        self.workers = workers
        self.split = split

    def __call__(self, item: tuple[int, Any]) -> tuple[int, Any]:
        b, payload = item
        if isinstance(payload, BatchError):
            return item
        if self.split is None:
            values, indices = payload, payload
        else:
            indices = [index for index, _ in payload]
            values = [value for _, value in payload]
        try:
            return b, self.workers.submit(b, values, self.split, indices)
        except Exception as exc:  # the worker died, failed to start, or was stopped
            return b, BatchError(_detached(exc), fatal=True)


def receive_from_workers(item: tuple[int, Any]) -> tuple[int, Any]:
    """A pipeline op: waits for what a worker made of batch ``b``."""
    b, future = item
    if isinstance(future, BatchError):
        return item
    try:
        return b, future.result()
    except Exception as exc:  # the worker died, or the epoch ended
        return b, BatchError(_detached(exc), fatal=True)


def _detached(exc: Exception) -> Exception:
    """``exc`` without the frames it was raised through here. They are this pipeline
    thread's, down to its loop, whose queues hold batches that view the workers' shared
    memory: an error the training loop keeps would keep them all. The error names its
    worker; where it first went wrong is in its notes."""
    return exc.with_traceback(None)


def tensor_bytes(batch: Any) -> int:
    """The bytes of the tensors in a (nested) batch."""
    return sum(
        t.numel() * t.element_size() for t in tree_leaves(batch) if isinstance(t, torch.Tensor)
    )


class SettleBatch:
    """``(b, Fetched)`` to ``(b, batch)``, ``(b, BatchError)`` or nothing (every sample
    failed and was skipped); runs on one thread, in batch order when the loader is ordered."""

    def __init__(
        self, budget: SkipBudget, collate_fn: Callable[[Any], Any], *, auto_collation: bool
    ) -> None:
        self.budget = budget
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation

    def __call__(self, item: tuple[int, Any]) -> Iterator[tuple[int, Any]]:
        b, fetched = item
        if not isinstance(fetched, Fetched):
            yield item
            return
        if fetched.errors is None:
            yield b, fetched.batch
            return
        if fetched.errors[0][0] < 0:  # collate_fn or __getitems__ failed: the whole batch
            error = fetched.errors[0][2]
            error.add_note(f"torch_spdl.DataLoader: that was batch {b} of the epoch")
            yield b, BatchError(error)
            return
        size = len(fetched.samples or []) + len(fetched.errors)
        slots = []
        for pos, sample in fetched.samples or []:
            slot = Slot(b, size, pos, None)
            slot.value = sample
            slots.append(slot)
        for pos, index, error in fetched.errors:
            slot = Slot(b, size, pos, index)
            slot.error = error
            slots.append(slot)
        slots.sort(key=lambda s: s.pos)
        settled = settle(b, slots, self.budget)
        if settled is None:
            return
        _, values = settled
        if isinstance(values, BatchError):
            yield settled
            return
        try:
            yield b, self.collate_fn(values if self.auto_collation else values[0])
        except Exception as exc:
            exc.add_note(f"torch_spdl.DataLoader: stage 'collate' failed on batch {b}")
            yield b, BatchError(exc)
