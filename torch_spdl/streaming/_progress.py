"""Where one consumer stands in its epoch: what it delivered, what its buffer holds.

The stream (:mod:`._stream`) hands raw samples over in a fixed order; this module mixes
them in the shuffle buffer, lets out the ones drawn to be decoded (:meth:`Progress.take`),
takes them back decoded, in the order drawn, as they are delivered
(:meth:`Progress.settle`), holds each piece to its failure budget, and keeps the state an
exact resume needs:

- the *cursor*: the piece, sample number and byte offset up to which the stream has been
  taken in (every piece before it, less what the buffer holds and what is being decoded,
  was delivered);
- the *pending* samples: drawn from the buffer, not delivered yet (being decoded), in the
  order drawn, by byte span;
- the samples the buffer holds, as runs (:mod:`._spans`), and its two counts (of draws,
  and of samples taken in), which are all its RNG and its ramp need (:mod:`._shuffle`).

Restoring reads back only the byte spans of the pending and buffered samples (a ranged
read per run), then the cursor's piece from the cursor's offset, then the pieces after it:
no byte of a delivered sample is read again (the bytes a resume reads are bounded by the
shuffle buffer and what is left of the epoch, not by the shards the buffer draws from),
and the samples come out in the order an uninterrupted epoch gives (the pending ones
first). A state saved by an earlier version (1 to 3: the buffer by slot, a Mersenne
Twister's state) restores the same samples, each once, in another order, with a warning.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from ._errors import ShardFailure
from ._plan import Consumer
from ._shuffle import ShuffleBuffer
from ._spans import Piece, Run, merge_runs, pack_runs, runs_of, unpack_runs
from ._stream import Failed, Sample, ShardEnd, ShardTask

__all__ = ["Progress", "STATE_VERSION"]

_LG = logging.getLogger("torch_spdl.streaming")

# 4: the buffer as packed runs, the draws counted (3: the buffer by slot and the
# Mersenne Twister's state, the samples taken in counted; 2: no ramp; 1: no pending)
STATE_VERSION = 4


def _key(sample: Sample) -> tuple[int, int]:
    return (sample.pos, sample.index)


class Progress:
    """One consumer's epoch: the buffer, delivery in the order drawn, the failure budget,
    the state. One thread calls it (the consumer's); the decoding between :meth:`take`
    and :meth:`settle` may run on others.

    Args:
        pieces: what the consumer reads, in order (whole shards, unless an elastic resume
            dealt it parts of some).
        consumer: who reads them.
        epoch: the epoch.
        seed: the data set's seed (the buffer's draws are seeded from it, the epoch and
            the consumer).
        buffer_size: the shuffle buffer's size.
        max_failures: bad samples each piece may have before the epoch fails.
        state: a state this consumer saved in this epoch, to continue from.
        buffer_initial: how many samples the buffer holds before it lets one out.
        record_pieces: put ``pieces`` in the state (they are not the consumer's shards of
            the epoch, which a resume would otherwise compute).
    """

    def __init__(
        self,
        pieces: Sequence[Piece],
        consumer: Consumer,
        epoch: int,
        seed: int,
        buffer_size: int,
        max_failures: int,
        state: dict[str, Any] | None = None,
        buffer_initial: int | None = None,
        record_pieces: bool = False,
    ) -> None:
        self.pieces = list(pieces)
        self.consumer = consumer
        self.epoch = epoch
        self.max_failures = max_failures
        self.record_pieces = record_pieces
        seed_text = f"torch_spdl.streaming:{seed}:{epoch}:{consumer.index}"
        self.buffer: ShuffleBuffer[Sample] = ShuffleBuffer(
            buffer_size, seed_text, _key, buffer_initial
        )
        self.cursor = self._begin(0)  # (piece pos, next sample number, byte offset)
        self.delivered = 0
        self.failures: dict[int, int] = {}
        self.drained = False  # the stream ended and the buffer was let out
        self.pending: deque[Sample] = deque()  # drawn, not delivered, in the order drawn
        self._loaded: dict[str, Any] | None = None  # the restored state, until settled
        self._buffered: set[tuple[int, int]] = set()  # restored buffer samples to come
        self._pending_slots: dict[tuple[int, int], int] = {}  # restored pending ones
        self._restored: list[Sample | None] = []  # the restored pending samples, in order
        self._refills: list[Run] = []  # what to read back: the pending and buffered ones
        if state is not None:
            self._restore(state)

    def _begin(self, pos: int) -> tuple[int, int, int]:
        if pos >= len(self.pieces):
            return (pos, 0, 0)
        piece = self.pieces[pos]
        return (pos, piece.first_index, piece.start)

    # -- the stream's tasks ---------------------------------------------------------------
    def tasks(self) -> list[ShardTask]:
        """What to read: the pending and buffered samples back, then from the cursor on."""
        if self.exhausted:
            return []
        tasks = [
            ShardTask(pos, self.pieces[pos].url, start, first, end, refill=True)
            for pos, first, _, start, end in merge_runs(self._refills)
        ]
        pos, index, offset = self.cursor
        if pos < len(self.pieces):
            piece = self.pieces[pos]
            tasks.append(ShardTask(pos, piece.url, offset, index, piece.end))
            tasks.extend(
                ShardTask(p, q.url, q.start, q.first_index, q.end)
                for p, q in enumerate(self.pieces[pos + 1 :], pos + 1)
            )
        return tasks

    # -- delivery -------------------------------------------------------------------------
    def take(self, item: Sample | Failed | ShardEnd) -> Iterator[Sample]:
        """The raw samples ``item`` lets out of the buffer, to be decoded and handed back
        to :meth:`settle` in this order (each is pending from here on)."""
        if isinstance(item, Sample):
            key = _key(item)
            if key in self._pending_slots:  # read back
                self._restored[self._pending_slots.pop(key)] = item
                return
            if key in self._buffered:  # a restored buffer's sample
                self._buffered.discard(key)
                self.buffer.insert(item)
                return
        if isinstance(item, ShardEnd):
            if item.pos >= self.cursor[0]:
                self.cursor = self._begin(item.pos + 1)
            return
        if isinstance(item, Failed):
            self._count_failure(item.pos, item.url, item.error)
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
        or ``(False, None)`` for a sample that failed to decode (held to its piece's
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
        if self._loaded is None:
            return
        self._loaded = None
        if self._buffered or self._pending_slots:
            # A sample that could not be read back (it failed this time) is lost, and the
            # order from here differs from the interrupted run's.
            lost = len(self._buffered) + len(self._pending_slots)
            _LG.warning("resume: %d buffered sample(s) could not be read back", lost)
            self._buffered.clear()
            self._pending_slots.clear()
        restored, self._restored = self._restored, []
        for sample in restored:
            if sample is not None:
                self.pending.append(sample)
                yield sample

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
        if self._loaded is not None:  # restored, not read back yet: as it was saved
            return dict(self._loaded)
        c = self.consumer
        spans = [(s.pos, s.index, s.start, s.end) for s in self.buffer.items]
        state = {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "consumer": [c.rank, c.world_size, c.worker, c.num_workers],
            "num_pieces": len(self.pieces),
            "cursor": list(self.cursor),
            "pending": [[s.pos, s.index, s.start, s.end] for s in self.pending],
            "buffer": pack_runs(runs_of(spans)),
            "draws": self.buffer.draws,
            "pushed": self.buffer.pushed,
            "delivered": self.delivered,
            "failures": dict(self.failures),
            "exhausted": self.exhausted,
        }
        if self.record_pieces:
            state["pieces"] = [[p.url, p.start, p.end, p.first_index] for p in self.pieces]
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        version = state.get("version")
        if version not in (1, 2, 3, STATE_VERSION):
            raise ValueError(f"unknown streaming state version {version!r}")
        self.cursor = tuple(int(x) for x in state["cursor"])  # type: ignore[assignment]
        self.delivered = int(state["delivered"])
        self.failures = {int(k): int(v) for k, v in state["failures"].items()}
        self.drained = bool(state["exhausted"])
        pending = [(int(p), int(i), int(s), int(e)) for p, i, s, e in state.get("pending", [])]
        if version == STATE_VERSION:
            self.buffer.draws = int(state["draws"])
            self.buffer.pushed = int(state["pushed"])
            runs = unpack_runs(state["buffer"])
        else:
            runs = runs_of((int(p), int(i), int(s), int(e)) for p, i, s, e in state["buffer"])
            self.buffer.pushed = self.buffer.size  # its ramp was over
            if runs or pending:
                _LG.warning(
                    "resume: a state of an earlier torch_spdl (version %s): the samples of "
                    "its shuffle buffer come back, each once, in another order",
                    version,
                )
        self._loaded = dict(state)
        self._buffered = {(p, i) for p, first, n, _, _ in runs for i in range(first, first + n)}
        self._refills = runs_of(pending) + runs
        self._restored = [None] * len(pending)
        self._pending_slots = {(p, i): k for k, (p, i, _, _) in enumerate(pending)}
