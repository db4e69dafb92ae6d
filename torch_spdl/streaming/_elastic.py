"""Resuming an epoch on another number of consumers (ranks x DataLoader workers).

A run preempted at ``W`` ranks of ``K`` workers and resumed at ``W'`` x ``K'`` must read
exactly the samples it had not delivered, each once. The states of *all* the saved
consumers together say what those are (each alone says only its own part):

- the samples a consumer had drawn and was decoding, and those its shuffle buffer held
  (runs of byte spans, :mod:`._spans`);
- the rest of the piece at its cursor, from the cursor's byte on;
- the pieces after it (whole shards, unless it was itself resumed elastically).

:func:`gather_states` gathers them (the loaders' ``state_dict()`` of every rank, or the
datasets', as ``StreamingDataset.load_state_dict`` is given them); :func:`share_of` lists
the rest of the epoch in one order that does not depend on who computes it and deals it
to the new consumers round-robin, as an epoch's shards are dealt, so that each piece goes
to exactly one of them. At the saved shape each consumer takes its own state instead (an
exact resume). What is given up at another shape, and said in a warning: the order. The
new consumers' buffers mix what they are dealt anew, so the rest of the epoch is the same
samples as the saved run's rest, not in its order (that order lives in the saved
consumers' buffers, which cannot be split); and the consumers' shares are equal in pieces,
not in samples (a consumer may get a shard's worth more than another).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._plan import Consumer
from ._spans import Piece, merge_runs, runs_of, unpack_runs

__all__ = ["gather_states", "in_flight", "saved_shape", "share_of", "warn_reordered"]

ELASTIC = "torch_spdl.streaming.elastic"


def _consumer_states(item: Any) -> Iterable[dict[str, Any]]:
    if isinstance(item, dict) and ELASTIC in item:
        yield from item["consumers"]
    elif isinstance(item, dict) and "consumer" in item and "cursor" in item:
        yield item
    elif isinstance(item, dict) and "dataset_states" in item:  # a loader's, with workers
        yield from item["dataset_states"].values()
    elif isinstance(item, dict) and "dataset_state" in item:  # a loader's, no workers
        yield item["dataset_state"]
    elif isinstance(item, (list, tuple)):
        for part in item:
            yield from _consumer_states(part)
    else:
        raise TypeError(
            "a stream resumes from the state_dict() of torch_spdl DataLoaders or of "
            f"StreamingDatasets (or lists of them), got {type(item).__name__}"
        )


def gather_states(states: Iterable[Any]) -> dict[str, Any]:
    """The state of a whole run, from the states of all its consumers.

    Args:
        states: the ``state_dict()`` of the DataLoader of every rank of the saved run,
            or of its ``StreamingDataset`` in every consumer; lists of them are flattened.

    Raises:
        ValueError: when a consumer of the saved run is missing (its samples would be
            lost), or the states are of different epochs or runs.
    """
    found: dict[int, dict[str, Any]] = {}
    shapes: set[tuple[int, int]] = set()
    epochs: set[int] = set()
    for state in _consumer_states(list(states)):
        consumer = Consumer(*state["consumer"])
        shapes.add((consumer.world_size, consumer.num_workers))
        epochs.add(int(state["epoch"]))
        if consumer.index in found and found[consumer.index] != state:
            raise ValueError(f"two different states of {consumer}")
        found[consumer.index] = state
    if not found:
        raise ValueError(
            "no streaming state given (a loader whose epoch ended holds none: start the "
            "next epoch instead)"
        )
    if len(shapes) > 1 or len(epochs) > 1:
        raise ValueError(
            f"the states are of different runs: world sizes x workers {sorted(shapes)}, "
            f"epochs {sorted(epochs)}"
        )
    (world, workers), (epoch,) = shapes.pop(), epochs
    missing = sorted(set(range(world * workers)) - set(found))
    if missing:
        who = ", ".join(str(Consumer(i % world, world, i // world, workers)) for i in missing)
        raise ValueError(
            f"the states of {len(missing)} consumer(s) of the saved run ({world} rank(s) x "
            f"{workers} worker(s)) are missing: {who}; the samples they had not delivered "
            "would be lost (pass the loader states of every rank)"
        )
    return {ELASTIC: 1, "epoch": epoch, "consumers": [found[i] for i in sorted(found)]}


def _buffer_runs(state: dict[str, Any]) -> list[tuple[int, int, int, int, int]]:
    spans = state.get("pending", [])
    runs = runs_of((int(p), int(i), int(s), int(e)) for p, i, s, e in spans)
    if state.get("version", 0) >= 4:
        return runs + unpack_runs(state["buffer"])
    return runs + runs_of((int(p), int(i), int(s), int(e)) for p, i, s, e in state["buffer"])


def saved_shape(run: dict[str, Any]) -> tuple[int, int]:
    """The saved run's world size and workers per rank."""
    consumer = Consumer(*run["consumers"][0]["consumer"])
    return consumer.world_size, consumer.num_workers


def warn_reordered(run: dict[str, Any], stacklevel: int) -> None:
    """Say what a resume on another number of consumers gives up."""
    world, workers = saved_shape(run)
    warnings.warn(
        f"resuming a stream saved at {world} rank(s) x {workers} worker(s) on another "
        "number: the rest of the epoch is every sample the saved run had not delivered, "
        "each once, but not in the order that run would have delivered them (the "
        f"{in_flight(run)} sample(s) its shuffle buffers held or were decoding are read "
        "back and mixed anew); see docs/streaming.md",
        stacklevel=stacklevel + 1,
    )


def in_flight(run: dict[str, Any]) -> int:
    """How many samples the saved consumers had in their buffers or being decoded."""
    return sum(n for state in run["consumers"] for *_, n, _, _ in _buffer_runs(state))


def _rest(state: dict[str, Any], pieces: Sequence[Piece]) -> list[Piece]:
    """What one saved consumer had not delivered, as pieces."""
    rest = [
        Piece(pieces[pos].url, start, end, first)
        for pos, first, _, start, end in merge_runs(_buffer_runs(state))
    ]
    if state.get("exhausted") or state.get("drained"):
        return rest
    pos, index, offset = (int(x) for x in state["cursor"])
    if pos < len(pieces):
        piece = pieces[pos]
        rest.append(Piece(piece.url, offset, piece.end, index))
        rest.extend(pieces[pos + 1 :])
    return rest


def share_of(
    run: dict[str, Any],
    consumer: Consumer,
    pieces_of: Callable[[Consumer], list[Piece]],
    order: Callable[[str], int],
) -> list[Piece]:
    """The pieces ``consumer`` reads of the rest of the saved epoch ``run``.

    Args:
        run: what :func:`gather_states` made.
        consumer: one consumer of the resumed run.
        pieces_of: a saved consumer's pieces of the epoch (its shards), for a state that
            does not list them.
        order: a URL's place in the data set's list (for the one order of the rest).
    """
    rest: list[Piece] = []
    for state in run["consumers"]:
        saved = Consumer(*state["consumer"])
        if "pieces" in state:
            pieces = [
                Piece(u, int(s), None if e is None else int(e), int(f))
                for u, s, e, f in state["pieces"]
            ]
        else:
            pieces = pieces_of(saved)
        rest += _rest(state, pieces)
    rest.sort(key=lambda p: (order(p.url), p.start, p.first_index))
    return rest[consumer.index :: consumer.count]
