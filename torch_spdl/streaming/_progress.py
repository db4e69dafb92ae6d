"""Where one consumer stands in its epoch: what it delivered, what its buffer holds.

The stream (:mod:`._stream`) hands samples over in a fixed order; this module turns them
into what the consumer yields (through the shuffle buffer), holds each shard to its failure
budget, and keeps the state an exact resume needs:

- the *cursor*: the shard, sample number and byte offset up to which the stream has been
  taken in (every shard before it, less what the buffer holds, was delivered);
- the buffer's samples, by identity and byte span, in slot order, and its RNG state.

Restoring reads back only the byte spans of the buffered samples (ranged reads, merged
when they lie close together), then the cursor's shard from the cursor's offset, then
the shards after it: no finished shard is read again, and the samples come out in the
order an uninterrupted epoch gives.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from ._errors import ShardFailure
from ._plan import Consumer
from ._shuffle import ShuffleBuffer
from ._stream import Failed, Sample, ShardEnd, ShardTask

__all__ = ["Progress"]

_LG = logging.getLogger("torch_spdl.streaming")

STATE_VERSION = 1
_MERGE_GAP = 1 << 20  # buffered samples this close in one shard are read back in one request


class Progress:
    """One consumer's epoch: delivery through the buffer, the failure budget, the state.

    Args:
        urls: the consumer's shards, in reading order.
        consumer: who reads them.
        epoch: the epoch.
        seed: the data set's seed (the buffer's RNG is seeded from it, the epoch and the
            consumer).
        buffer_size: the shuffle buffer's size.
        max_failures: bad samples each shard may have before the epoch fails.
        state: a state this consumer saved in this epoch, to continue from.
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
    ) -> None:
        self.urls = list(urls)
        self.consumer = consumer
        self.epoch = epoch
        self.max_failures = max_failures
        self.buffer: ShuffleBuffer[Sample] = ShuffleBuffer(
            buffer_size, f"torch_spdl.streaming:{seed}:{epoch}:{consumer.index}"
        )
        self.cursor = (0, 0, 0)  # (shard pos, next sample number, byte offset)
        self.delivered = 0
        self.failures: dict[int, int] = {}
        self.exhausted = False
        self._slots: dict[tuple[int, int], int] = {}  # refills still to come
        self._refills: list[tuple[int, int, int, int]] = []
        if state is not None:
            self._restore(state)

    # -- the stream's tasks ---------------------------------------------------------------
    def tasks(self) -> list[ShardTask]:
        """What to read: the buffer's samples back, then from the cursor on."""
        if self.exhausted:
            return []
        tasks = _refill_tasks(self.urls, self._refills)
        pos, index, offset = self.cursor
        if pos < len(self.urls):
            tasks.append(ShardTask(pos, self.urls[pos], offset, index))
            tasks.extend(ShardTask(p, self.urls[p]) for p in range(pos + 1, len(self.urls)))
        return tasks

    # -- delivery -------------------------------------------------------------------------
    def take(self, item: Sample | Failed | ShardEnd) -> Iterator[Any]:
        """The values ``item`` lets out of the buffer (state updated before each)."""
        if isinstance(item, ShardEnd):
            if item.pos >= self.cursor[0]:
                self.cursor = (item.pos + 1, 0, 0)
            return
        if isinstance(item, Failed):
            self._failed(item)
            return
        slot = self._slots.pop((item.pos, item.index), None)
        if slot is not None:  # a restored buffer's sample, read back
            self.buffer.items[slot] = item
            return
        self._settle_refills()
        self.cursor = (item.pos, item.index + 1, item.end)
        out = self.buffer.push(item)
        if out is not None:
            self.delivered += 1
            yield out.value

    def finish(self) -> Iterator[Any]:
        """The end of the stream: what the buffer still holds."""
        self._settle_refills()
        for item in self.buffer.drain():
            self.delivered += 1
            yield item.value
        self.exhausted = True

    def _settle_refills(self) -> None:
        if not self._slots:
            return
        # A buffered sample that could not be read back (it failed this time): its slot
        # goes, and the order from here differs from the interrupted run's.
        lost = len(self._slots)
        _LG.warning("resume: %d buffered sample(s) could not be read back", lost)
        self._slots.clear()
        self.buffer.items = [s for s in self.buffer.items if s is not None]

    def _failed(self, item: Failed) -> None:
        if item.index >= 0 and (item.pos, item.index) in self._slots:
            self._slots.pop((item.pos, item.index))
        elif item.index >= 0:
            self.cursor = (item.pos, item.index + 1, item.end)
        count = self.failures.get(item.pos, 0) + 1
        self.failures[item.pos] = count
        if count > self.max_failures:
            raise ShardFailure(item.url, count, self.max_failures, item.error) from item.error
        _LG.warning(
            "skipping a bad sample (%d of %d allowed in shard %s): %s: %s",
            count,
            self.max_failures,
            item.url,
            type(item.error).__name__,
            item.error,
        )

    # -- the state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        c = self.consumer
        items = [s for s in self.buffer.items if s is not None]
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "consumer": [c.rank, c.world_size, c.worker, c.num_workers],
            "num_shards": len(self.urls),
            "cursor": list(self.cursor),
            "buffer": [[s.pos, s.index, s.start, s.end] for s in items],
            "rng": self.buffer.get_rng_state(),
            "delivered": self.delivered,
            "failures": dict(self.failures),
            "exhausted": self.exhausted,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown streaming state version {state.get('version')!r}")
        pos, index, offset = (int(x) for x in state["cursor"])
        self.cursor = (pos, index, offset)
        self.delivered = int(state["delivered"])
        self.failures = {int(k): int(v) for k, v in state["failures"].items()}
        self.exhausted = bool(state["exhausted"])
        self.buffer.set_rng_state(state["rng"])
        spans = [(int(p), int(i), int(s), int(e)) for p, i, s, e in state["buffer"]]
        self._refills = spans
        self.buffer.items = [None] * len(spans)  # type: ignore[list-item]
        self._slots = {(s[0], s[1]): i for i, s in enumerate(spans)}


def _refill_tasks(
    urls: Sequence[str], spans: Sequence[tuple[int, int, int, int]]
) -> list[ShardTask]:
    """Ranged reads that bring back the samples ``(pos, index, start, end)``: one per run
    of samples of one shard that lie within ``_MERGE_GAP`` of each other."""
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
