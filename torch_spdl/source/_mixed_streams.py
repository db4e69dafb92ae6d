"""``MixedStreams``: streams of unknown length mixed by weight, at each consumer.

A stream cannot be indexed, so there is no global order to deal: each stream deals
itself to the ranks and workers (``EpochStream``), and each consumer (a rank's loader
worker, or the rank) draws which of its own streams gives the next sample, at the
weights' odds, from a ``random.Random`` seeded by ``(seed, epoch, consumer)``. What the
policies mean when a stream ends is decided at the draw that finds it ended: stop
(``"first_exhausted"``), start that stream over until every stream has ended once
(``"cycle"``), or drop it and go on with the others (``"all_exhausted"``).

Resuming at the same shape is exact when every stream is stateful: the mix's state holds
the draw RNG, each stream's own state and which streams have ended. On another number of
ranks or workers the draws cannot be dealt again (each consumer's streams hold their own
shares); when every stream can deal its own rest again (``StreamingDataset``), the list of
every rank's loader state resumes the mix there (:mod:`._streams_resume`: every sample not
delivered, once, drawn anew); otherwise the epoch starts over, with a warning saying so.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ._apportion import POLICIES, check_weights
from ._ranks import resolve_rank_and_world_size
from ._seeds import derive_seed
from ._streams_resume import FORMAT, RunOfStreams, elastic_streams
from ._types import EpochStream

__all__ = ["MixedStreams"]

_FORMAT = FORMAT


def _warn_redrawn(run: RunOfStreams, stacklevel: int) -> None:
    warnings.warn(
        f"MixedStreams: resuming a mix saved at {run['consumers']} consumer(s) on another "
        "number: every sample not delivered comes once, but drawn anew, not in the saved "
        "order; an epoch_length's rest is split evenly, and under 'cycle' or "
        "'first_exhausted' no stream counts as ended (see torch_spdl.source._streams_resume)",
        stacklevel=stacklevel + 1,
    )


class MixedStreams(torch.utils.data.IterableDataset[Any]):
    """Samples drawn from ``streams`` at the odds of ``weights``, at each consumer.

    Args:
        streams: :class:`~torch_spdl.source.EpochStream` objects (they deal themselves
            to ranks and workers; a map-style mix joins as a ``MixedIterableDataset``).
        weights: one positive weight per stream (default: equal).
        policy: ``"all_exhausted"`` (default: an ended stream leaves the mix),
            ``"first_exhausted"`` (the epoch ends with the first stream that ends) or
            ``"cycle"`` (an ended stream starts over until every stream has ended once).
        epoch_length: samples per epoch across all consumers (each takes its share,
            ``epoch_length // consumers``, one more for the first ``epoch_length %
            consumers``); the policy may end it sooner (``"cycle"`` never does).
        seed: the seed of the draws.
        rank: this process's rank (default: detected).
        world_size: the number of ranks (default: detected).
    """

    def __init__(
        self,
        streams: Sequence[EpochStream[Any]],
        weights: Sequence[float] | None = None,
        *,
        policy: str = "all_exhausted",
        epoch_length: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if not streams:
            raise ValueError("MixedStreams needs at least one stream")
        for i, s in enumerate(streams):
            if not isinstance(s, EpochStream):
                raise TypeError(
                    f"stream {i} ({type(s).__name__}) is not an EpochStream (set_epoch and "
                    "__iter__, dealing itself to ranks and workers); a plain iterable would "
                    "be read whole by every consumer: use torch_spdl.source.utils.MergeIterator"
                )
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.streams = list(streams)
        self.weights = [1.0] * len(streams) if weights is None else [float(w) for w in weights]
        check_weights(self.weights, len(self.streams))
        self.policy = policy
        self.epoch_length = epoch_length
        self.seed = seed
        self.rank, self.world_size = resolve_rank_and_world_size(rank, world_size)
        self.epoch = 0
        self._live: dict[str, Any] | None = None  # the current iteration's state
        self._restore: dict[str, Any] | None = None
        self._run: RunOfStreams | None = None  # a saved run resumed elastically

    def set_epoch(self, epoch: int) -> None:
        """Select ``epoch`` for the next iteration, here and in every stream."""
        self.epoch = epoch
        for s in self.streams:
            s.set_epoch(epoch)

    def _consumer(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return worker * self.world_size + self.rank, workers * self.world_size

    def _quota(self, consumer: int, consumers: int) -> int | None:
        if self.epoch_length is None:
            return None
        return len(range(consumer, self.epoch_length, consumers))

    def __iter__(self) -> Iterator[Any]:
        consumer, consumers = self._consumer()
        state = self._restored(consumer, consumers)
        quota = self._quota(consumer, consumers)
        if state is None and self._run is not None:
            state, quota = self._resumed(consumer, consumers)
        if state is None:
            rng = random.Random(derive_seed(self.seed, "streams", self.epoch, consumer))
            state = {"epoch": self.epoch, "consumer": consumer, "consumers": consumers,
                     "world_size": self.world_size,
                     "rng": rng.getstate(), "ended": [False] * len(self.streams),
                     "gone": [False] * len(self.streams), "pass": [0] * len(self.streams),
                     "delivered": 0}  # fmt: skip
        self._live = state
        return self._draws(state, quota)

    def _resumed(self, consumer: int, consumers: int) -> tuple[dict[str, Any] | None, int | None]:
        """This consumer's start in the saved run ``self._run`` (its streams already hold
        their shares): the saved mix state at the saved shape (exact), else a new draw."""
        run, self._run = self._run, None
        assert run is not None
        if run["consumers"] == consumers:  # the saved shape: exact
            mix = run["mixes"].get(consumer)  # None: it had not started, so it starts
            if mix is not None:
                mix = {**mix, **{k: list(mix[k]) for k in ("ended", "gone", "pass")}}
            return mix, self._quota(consumer, consumers)
        if run["world_size"] == self.world_size:  # load_state_dict could not tell
            _warn_redrawn(run, stacklevel=3)
        rng = random.Random(derive_seed(self.seed, "streams-resumed", self.epoch, consumer))
        n = len(self.streams)
        state = {"epoch": self.epoch, "consumer": consumer, "consumers": consumers,
                 "world_size": self.world_size,
                 "rng": rng.getstate(), "ended": [False] * n, "gone": [False] * n,
                 "pass": [0] * n, "delivered": 0}  # fmt: skip
        left = None if self.epoch_length is None else self.epoch_length - run["delivered"]
        return state, None if left is None else len(range(consumer, max(left, 0), consumers))

    def _draws(self, state: dict[str, Any], quota: int | None) -> Iterator[Any]:
        """The samples of one consumer's epoch, from ``state`` on (kept up to date in it)."""
        rng = random.Random()
        rng.setstate(state["rng"])
        iterators: list[Iterator[Any] | None] = [iter(s) for s in self.streams]
        order = list(range(len(self.streams)))
        while quota is None or state["delivered"] < quota:
            live = [i for i in order if not state["gone"][i]]
            if not live:
                return
            pick = rng.choices(live, [self.weights[i] for i in live])[0]
            it = iterators[pick]
            assert it is not None
            try:
                sample = next(it)
            except StopIteration:
                if not self._ended(state, pick):
                    state["rng"] = rng.getstate()
                    return
                iterators[pick] = iter(self.streams[pick]) if not state["gone"][pick] else None
                state["rng"] = rng.getstate()
                continue
            state["delivered"] += 1
            state["pass"][pick] += 1
            state["rng"] = rng.getstate()
            yield sample

    def _ended(self, state: dict[str, Any], pick: int) -> bool:
        """Stream ``pick`` ended: whether the epoch goes on (and how, in ``state``)."""
        state["ended"][pick] = True
        if self.policy == "first_exhausted":
            return False
        empty, state["pass"][pick] = state["pass"][pick] == 0, 0
        if self.policy == "all_exhausted" or empty:  # an empty pass cannot be cycled
            state["gone"][pick] = True
            return not all(state["gone"])
        # cycle: it starts over, unless every stream has ended once and no length is set
        return self.epoch_length is not None or not all(state["ended"])

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This consumer's position: the draws' RNG, the count, which streams ended, and
        each stream's own state (None for a stream without ``state_dict``)."""
        live = self._live
        streams = [s.state_dict() if hasattr(s, "state_dict") else None for s in self.streams]
        return {"format": _FORMAT, "mix": dict(live) if live else None, "streams": streams}

    def load_state_dict(self, state: Any) -> None:
        """Resume where a saved run stopped.

        Args:
            state: a consumer's own state (the loader hands each worker its own, at the
                same shape); or the list of the ``state_dict()`` of every rank's
                ``torch_spdl.DataLoader`` of the saved run, on any number of ranks and
                workers, when every stream can deal its own rest again (its class sets
                ``resumes_from_consumer_states``, as ``StreamingDataset``'s does): call
                this before the DataLoader is made. At the saved shape that is exact; at
                another, every sample not delivered comes once, drawn anew (a warning
                says so). A list the streams cannot take: the epoch starts over, with a
                warning.

        Raises:
            ValueError: for states of different runs, or a list that misses a consumer.
        """
        run = elastic_streams(self.streams, state)
        if run is not None:
            self.epoch, self._run, self._restore = run["epoch"], run, None
            if run["world_size"] != self.world_size:  # workers only: the consumer says it
                _warn_redrawn(run, stacklevel=2)
            return
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            warnings.warn(
                "MixedStreams: a mix of streams cannot resume on another number of ranks or "
                "workers (each consumer's streams hold their own shares): this epoch starts "
                "over, and samples delivered before the state was saved are delivered again",
                stacklevel=2,
            )
            self._restore = None
            return
        self._restore = state

    def _restored(self, consumer: int, consumers: int) -> dict[str, Any] | None:
        saved, self._restore = self._restore, None
        if saved is None or saved["mix"] is None:
            return None
        mix = saved["mix"]
        if (mix["consumer"], mix["consumers"]) != (consumer, consumers):
            warnings.warn(
                f"MixedStreams: the state is of consumer {mix['consumer']} of "
                f"{mix['consumers']}, this is {consumer} of {consumers}: a mix of streams "
                "cannot be dealt again, so this epoch starts over (samples delivered before "
                "are delivered again)",
                stacklevel=3,
            )
            return None
        for i, (stream, own) in enumerate(zip(self.streams, saved["streams"], strict=True)):
            if own is not None and hasattr(stream, "load_state_dict"):
                stream.load_state_dict(own)
            else:
                warnings.warn(
                    f"MixedStreams: stream {i} ({type(stream).__name__}) has no state: it "
                    "starts its epoch over, and what it delivered before is delivered again",
                    stacklevel=3,
                )
        restored = dict(mix)
        for key in ("ended", "gone", "pass"):
            restored[key] = list(mix[key])
        return restored
