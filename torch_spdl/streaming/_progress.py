"""Where one consumer stands in its epoch: what it delivered, what its buffer holds.

The stream (:mod:`._stream`) hands raw samples over in a fixed order; this module mixes
them in the shuffle buffer, lets out the ones drawn to be decoded (:meth:`Progress.take`),
takes them back decoded, in the order drawn, as they are delivered
(:meth:`Progress.settle`), holds each shard to its failure budget, and keeps the state an
exact resume needs:

- the *cursor*: the shard, sample number and byte offset up to which the stream has been
  taken in (every shard before it, less what the buffer holds and what is being decoded,
  was delivered);
- the *pending* samples: drawn from the buffer, not delivered yet (being decoded), in the
  order drawn;
- the buffer's samples, by identity and byte span, in slot order, and its RNG state.

Restoring reads back only the byte spans of the pending and buffered samples (a ranged
read per run of adjacent ones), then the cursor's shard from the cursor's offset, then the
shards after it: no byte of a delivered sample is read again (the bytes a resume reads are
bounded by the shuffle buffer and what is left of the epoch, not by the shards the buffer
draws from), and the samples come out in the order an uninterrupted epoch gives (the
pending ones first).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from ._errors import ShardFailure
from ._plan import Consumer
from ._shuffle import ShuffleBuffer
from ._stream import Failed, Sample, ShardEnd, ShardTask

__all__ = ["Progress"]

_LG = logging.getLogger("torch_spdl.streaming")

STATE_VERSION = 3  # 3: the buffer's count (2: a buffer full before the first out; 1: no pending)
# Buffered samples of one shard are read back in one request when they touch: a gap is a
# delivered sample, and a resume reads no byte of one (its cost is a request per run of
# adjacent samples, read_concurrency at a time).
_MERGE_GAP = 0


class Progress:
    """One consumer's epoch: the buffer, delivery in the order drawn, the failure budget,
    the state. One thread calls it (the consumer's); the decoding between :meth:`take`
    and :meth:`settle` may run on others.

    Args:
        urls: the consumer's shards, in reading order.
        consumer: who reads them.
        epoch: the epoch.
        seed: the data set's seed (the buffer's RNG is seeded from it, the epoch and the
            consumer).
        buffer_size: the shuffle buffer's size.
        max_failures: bad samples each shard may have before the epoch fails.
        state: a state this consumer saved in this epoch, to continue from.
        buffer_initial: how many samples the buffer holds before it lets one out.
    """

    def __init__(
        self,
        urls: Sequence[str],
        consumer: Consumer,
        epoch: int,
        seed: int,
        buffer_size: int,
        max_failures: int,
        state: dict[str, Any] | None = None,
        buffer_initial: int | None = None,
    ) -> None:
        self.urls = list(urls)
        self.consumer = consumer
        self.epoch = epoch
        self.max_failures = max_failures
        self.buffer: ShuffleBuffer[Sample] = ShuffleBuffer(
            buffer_size, f"torch_spdl.streaming:{seed}:{epoch}:{consumer.index}", buffer_initial
        )
        self.cursor = (0, 0, 0)  # (shard pos, next sample number, byte offset)
        self.delivered = 0
        self.failures: dict[int, int] = {}
        self.drained = False  # the stream ended and the buffer was let out
        self.pending: deque[Sample] = deque()  # drawn, not delivered, in the order drawn
        self._slots: dict[tuple[int, int], int] = {}  # refills still to come: buffer slots
        self._pending_slots: dict[tuple[int, int], int] = {}  # and restored pending ones
        self._restored: list[Sample | None] = []  # the restored pending samples, in order
        self._restored_spans: list[tuple[int, int, int, int]] = []
        self._refills: list[tuple[int, int, int, int]] = []
        if state is not None:
            self._restore(state)

    # -- the stream's tasks ---------------------------------------------------------------
    def tasks(self) -> list[ShardTask]:
        """What to read: the pending and buffered samples back, then from the cursor on."""
        if self.exhausted:
            return []
        tasks = _refill_tasks(self.urls, self._refills)
        pos, index, offset = self.cursor
        if pos < len(self.urls):
            tasks.append(ShardTask(pos, self.urls[pos], offset, index))
            tasks.extend(ShardTask(p, self.urls[p]) for p in range(pos + 1, len(self.urls)))
        return tasks

    # -- delivery -------------------------------------------------------------------------
    def take(self, item: Sample | Failed | ShardEnd) -> Iterator[Sample]:
        """The raw samples ``item`` lets out of the buffer, to be decoded and handed back
        to :meth:`settle` in this order (each is pending from here on)."""
        key = (item.pos, item.index) if isinstance(item, (Sample, Failed)) else None
        if isinstance(item, Sample) and key in self._pending_slots:  # read back
            self._restored[self._pending_slots.pop(key)] = item
            return
        if isinstance(item, Sample) and key in self._slots:  # a restored buffer's sample
            self.buffer.items[self._slots.pop(key)] = item
            return
        if isinstance(item, ShardEnd):
            if item.pos >= self.cursor[0]:
                self.cursor = (item.pos + 1, 0, 0)
            return
        if isinstance(item, Failed):
            self._failed(item)
            return
        yield from self._settle_refills()
        self.cursor = (item.pos, item.index + 1, item.end)
        out = self.buffer.push(item)
        if out is not None:
            self.pending.append(out)
            yield out

    def finish(self) -> Iterator[Sample]:
        """The end of the stream: what the buffer still holds (pending from here on)."""
        yield from self._settle_refills()
        for item in self.buffer.drain():
            self.pending.append(item)
            yield item
        self.drained = True

    @property
    def exhausted(self) -> bool:
        """Whether every sample of the epoch was delivered (or failed)."""
        return self.drained and not self.pending

    def settle(self, item: Sample | Failed) -> tuple[bool, Any]:
        """The oldest pending sample, back from decoding: ``(True, value)`` to deliver,
        or ``(False, None)`` for a sample that failed to decode (held to its shard's
        budget: one over it raises :class:`ShardFailure`)."""
        drawn = self.pending.popleft()
        assert (drawn.pos, drawn.index) == (item.pos, item.index), "settled out of order"
        if isinstance(item, Failed):
            self._count_failure(item.pos, item.url, item.error)
            return False, None
        self.delivered += 1
        return True, item.value

    def _settle_refills(self) -> Iterator[Sample]:
        """Once the read-back is over: the restored pending samples go out first."""
        if self._slots or self._pending_slots:
            # A sample that could not be read back (it failed this time): its slot goes,
            # and the order from here differs from the interrupted run's.
            lost = len(self._slots) + len(self._pending_slots)
            _LG.warning("resume: %d buffered sample(s) could not be read back", lost)
            self._slots.clear()
            self._pending_slots.clear()
            self.buffer.items = [s for s in self.buffer.items if s is not None]
        restored, self._restored = self._restored, []
        for sample in restored:
            if sample is not None:
                self.pending.append(sample)
                yield sample

    def _failed(self, item: Failed) -> None:
        key = (item.pos, item.index)
        if item.index >= 0 and key in self._slots:
            self._slots.pop(key)
        elif item.index >= 0 and key in self._pending_slots:
            self._pending_slots.pop(key)
        elif item.index >= 0:
            self.cursor = (item.pos, item.index + 1, item.end)
        self._count_failure(item.pos, item.url, item.error)

    def _count_failure(self, pos: int, url: str, error: BaseException) -> None:
        count = self.failures.get(pos, 0) + 1
        self.failures[pos] = count
        if count > self.max_failures:
            raise ShardFailure(url, count, self.max_failures, error) from error
        _LG.warning(
            "skipping a bad sample (%d of %d allowed in shard %s): %s: %s",
            count,
            self.max_failures,
            url,
            type(error).__name__,
            error,
        )

    # -- the state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        c = self.consumer
        items = [s for s in self.buffer.items if s is not None]
        pending = [[s.pos, s.index, s.start, s.end] for s in self.pending]
        if self._restored:  # restored, not let out again yet: as they were saved
            pending += [list(span) for span in self._restored_spans]
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "consumer": [c.rank, c.world_size, c.worker, c.num_workers],
            "num_shards": len(self.urls),
            "cursor": list(self.cursor),
            "pending": pending,
            "buffer": [[s.pos, s.index, s.start, s.end] for s in items],
            "rng": self.buffer.get_rng_state(),
            "pushed": self.buffer.pushed,
            "delivered": self.delivered,
            "failures": dict(self.failures),
            "exhausted": self.exhausted,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("version") not in (1, 2, STATE_VERSION):
            raise ValueError(f"unknown streaming state version {state.get('version')!r}")
        pos, index, offset = (int(x) for x in state["cursor"])
        self.cursor = (pos, index, offset)
        self.delivered = int(state["delivered"])
        self.failures = {int(k): int(v) for k, v in state["failures"].items()}
        self.drained = bool(state["exhausted"])
        self.buffer.set_rng_state(state["rng"])
        if "pushed" in state:
            self.buffer.pushed = int(state["pushed"])
        else:  # saved by a buffer that let nothing out before it was full
            self.buffer.initial = self.buffer.size
        spans = [(int(p), int(i), int(s), int(e)) for p, i, s, e in state["buffer"]]
        pending = [(int(p), int(i), int(s), int(e)) for p, i, s, e in state.get("pending", [])]
        self._refills = pending + spans
        self.buffer.items = [None] * len(spans)  # type: ignore[list-item]
        self._slots = {(s[0], s[1]): i for i, s in enumerate(spans)}
        self._restored = [None] * len(pending)
        self._restored_spans = pending
        self._pending_slots = {(s[0], s[1]): i for i, s in enumerate(pending)}


def _refill_tasks(
    urls: Sequence[str], spans: Sequence[tuple[int, int, int, int]]
) -> list[ShardTask]:
    """Ranged reads that bring back the samples ``(pos, index, start, end)``: one per run
    of samples of one shard that lie within ``_MERGE_GAP`` of each other (that touch)."""
    by_shard: dict[int, list[tuple[int, int, int]]] = {}
    for pos, index, start, end in spans:
        by_shard.setdefault(pos, []).append((start, end, index))
    tasks: list[ShardTask] = []
    for pos in sorted(by_shard):
        runs: list[list[tuple[int, int, int]]] = []
        for span in sorted(by_shard[pos]):
            if runs and span[0] - runs[-1][-1][1] <= _MERGE_GAP:
                runs[-1].append(span)
            else:
                runs.append([span])
        for run in runs:
            wanted = tuple((start, index) for start, _, index in run)
            tasks.append(
                ShardTask(pos, urls[pos], run[0][0], end=max(e for _, e, _ in run), wanted=wanted)
            )
    return tasks
