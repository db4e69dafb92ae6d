"""Elastic resume: what each rank saves, and how the states of all ranks become one
resume point that any number of ranks and workers can start from.

A rank's state (a *record*) holds the identity of the epoch's global order (kind, seed,
epoch, length and a fingerprint of what else shapes it), what had been delivered before
this stretch of the epoch (a :class:`~._deal.Delivered`: the resume point it started
from, empty at the start of an epoch), how the remainder was split (world size,
evening), the rank, and for each of its *consumers* (the rank itself for a sampler, each
worker for an iterable dataset) how many of its own sequence the training loop received,
plus any received out of order. That is a few numbers per worker, whatever the epoch's
size.

:func:`merge` takes every rank's record and computes the new
:class:`~._deal.Delivered` from counts alone (``_deal``: a watermark below which all is
delivered, plus the few positions past it), so the rest of the epoch is exactly what no
consumer delivered, in the global order, ready to be split again at any world size. A
rank whose record is missing cannot be guessed: that is an error naming it, never a
silent redelivery or loss.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._deal import Blocks, Delivered, Split

__all__ = ["FORMAT", "ResumePoint", "consumer_entry", "identity", "merge", "rank_record"]

FORMAT = "torch_spdl.source/elastic-1"
_IDENTITY_KEYS = ("kind", "seed", "length", "config")


def identity(kind: str, seed: int, epoch: int, length: int, config: str) -> dict[str, Any]:
    """The identity of one epoch's global order, as records carry it."""
    return {"kind": kind, "seed": seed, "epoch": epoch, "length": length, "config": config,
            "torch": str(torch.__version__)}  # fmt: skip


def consumer_entry(blocks: Blocks, delivered: int, extra: Iterable[int] = ()) -> dict[str, Any]:
    """One consumer's progress: the first ``delivered`` of its sequence, and ``extra``."""
    return {**blocks.as_dict(), "delivered": int(delivered), "extra": sorted(set(extra))}


def rank_record(
    order: Mapping[str, Any],
    before: Delivered,
    split: Split,
    rank: int,
    consumers: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """A rank's record (see the module's notes)."""
    return {
        "format": FORMAT,
        "order": dict(order),
        "delivered_before": before.as_dict(),
        "split": split.as_dict(),
        "rank": rank,
        "consumers": [dict(c) for c in consumers],
    }


@dataclass(frozen=True)
class ResumePoint:
    """Where an epoch resumes: its order's identity and what was delivered of it."""

    order: dict[str, Any]
    delivered: Delivered

    @property
    def epoch(self) -> int:
        return int(self.order["epoch"])

    def check(self, ours: Mapping[str, Any], who: str) -> None:
        """ValueError unless ``ours`` (the loading side's identity of the same epoch) is
        the saved order's; a warning when torch differs (its generators drew the order)."""
        for key in _IDENTITY_KEYS:
            if self.order.get(key) != ours.get(key):
                raise ValueError(
                    f"{who}: the state is of another order ({key} {self.order.get(key)!r}, "
                    f"here {ours.get(key)!r}): resume with the sampler or dataset it was "
                    "saved from (same datasets, weights, policy, seed)"
                )
        if self.order.get("torch") != str(torch.__version__):
            warnings.warn(
                f"{who}: the state was saved under torch {self.order.get('torch')}, this is "
                f"{torch.__version__}; the order is drawn by torch's generators, and if they "
                "changed, the resumed epoch is not the rest of the saved one",
                stacklevel=3,
            )


def _records(states: Any) -> list[Mapping[str, Any]]:
    """Every record in ``states``: one, or a (nested) list of them."""
    if isinstance(states, Mapping):
        if states.get("format") != FORMAT:
            keys = ", ".join(sorted(map(str, states))[:6])
            raise TypeError(
                "expected the elastic state of every rank (what elastic_state(loader) or "
                f"sampler.state_dict() returns), got a dict with keys {keys}"
            )
        return [states]
    if isinstance(states, (list, tuple)):
        return [r for s in states for r in _records(s)]
    raise TypeError(f"expected a state or a list of states, got {type(states).__name__}")


def _same(records: list[Mapping[str, Any]], key: str) -> Any:
    first = records[0][key]
    for r in records[1:]:
        if r[key] != first:
            raise ValueError(
                f"the states are of different epochs or runs ({key}: {first!r} and {r[key]!r})"
            )
    return first


def _by_rank(records: list[Mapping[str, Any]], world: int) -> dict[int, list[Mapping[str, Any]]]:
    """Each rank's consumers, every worker of every rank present exactly once."""
    ranks: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        ranks.setdefault(int(r["rank"]), []).extend(r["consumers"])
    missing = sorted(set(range(world)) - set(ranks))
    if missing or len(ranks) != world:
        raise ValueError(
            f"the states cover ranks {sorted(ranks)} of a world of {world}: the state of "
            f"ranks {missing} is missing, and what they delivered cannot be known "
            "(pass the state of every rank)"
        )
    for rank, entries in ranks.items():
        workers = sorted(int(c["worker"]) for c in entries)
        counts = {int(c["num_workers"]) for c in entries}
        if len(counts) != 1 or workers != list(range(counts.pop())):
            raise ValueError(
                f"rank {rank}'s state covers workers {workers} of "
                f"{sorted(int(c['num_workers']) for c in entries)}: each worker must be there once"
            )
    return ranks


def merge(states: Any) -> ResumePoint:
    """The resume point of the epoch the states describe (see the module's notes).

    Args:
        states: every rank's record (a list), or one record for a world of one.

    Raises:
        TypeError: for something that is not a record.
        ValueError: for records of different epochs or runs, or a rank or worker missing.
    """
    records = _records(states)
    if not records:
        raise ValueError("no state to resume from")
    order = _same(records, "order")
    before = Delivered.from_dict(_same(records, "delivered_before"))
    split_state = _same(records, "split")
    split = Split(int(split_state["world_size"]), bool(split_state["even_out"]),
                  bool(split_state["drop_last"]))  # fmt: skip
    ranks = _by_rank(records, split.world_size)
    return ResumePoint(dict(order), _advance(before, split, ranks))


def _advance(
    before: Delivered, split: Split, ranks: Mapping[int, Sequence[Mapping[str, Any]]]
) -> Delivered:
    """``before`` plus what every consumer delivered of the remainder (counts to positions:
    see ``_deal``)."""
    rem, world = before.remaining, split.world_size
    flows = []
    low = split.dealt(rem)  # no index at or past it is dealt, hence none delivered
    for rank, entries in ranks.items():
        share = split.share_length(rem, rank)
        for entry in entries:
            blocks = Blocks(int(entry["worker"]), int(entry["num_workers"]), int(entry["block"]))
            mine = blocks.length(share)
            count = min(int(entry["delivered"]), mine)
            raw = _raw(rank, world, blocks)
            if count < mine:
                low = min(low, raw(count))
            extra = [s for s in entry.get("extra", ()) if count <= s < mine]
            flows.append((raw, count, extra))
    # Every consumer's sequence maps to rising remainder indices, and each index below the
    # lowest first-undelivered one belongs to a consumer that has passed it.
    extra_indices: set[int] = set()
    for raw, count, extra in flows:
        start = bisect.bisect_left(range(count), low, key=raw)
        for s in [*range(start, count), *extra]:
            i = raw(s)
            i = i % rem if i >= rem else i  # padding: the remainder started over
            if i >= low:
                extra_indices.add(i)
    mark = before.position(low) if low < rem else before.length
    extra_positions = {before.position(i) for i in extra_indices}
    extra_positions |= {e for e in before.extra if e > mark}
    return Delivered.from_positions(before.length, mark, extra_positions)


def _raw(rank: int, world: int, blocks: Blocks) -> Any:
    """A consumer's ``s``-th as an index of its rank's dealt sequence (past the
    remainder's end where the share is padded)."""

    def raw(s: int) -> int:
        return rank + world * blocks.share_index(s)

    return raw
