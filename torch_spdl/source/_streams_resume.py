"""A ``MixedStreams`` epoch resumed from the states of every consumer of the saved run.

A mix of streams has no global order to deal again: each consumer's streams hold their own
shares. What can be dealt again is each *stream's* rest, when the stream can take the list
of every saved consumer's state of it and give each new consumer its share
(``StreamingDataset`` does: its class sets ``resumes_from_consumer_states``). The mix then
has every stream's rest, and a new consumer draws from its shares anew. What a resume on
another number of consumers gives up, and says: the draws (the mix's order), and for an
``epoch_length`` the split of what is left of it (dealt evenly to the new consumers); under
``"cycle"`` or ``"first_exhausted"`` which streams had ended (the new draws start with
none ended). Under ``"all_exhausted"`` (the default) without ``epoch_length``, the rest of
the epoch is every sample the saved run had not delivered, each once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["RunOfStreams", "consumer_states", "elastic_streams"]

FORMAT = "torch_spdl.source/streams-1"
RunOfStreams = dict[str, Any]


def consumer_states(item: Any) -> Iterable[Mapping[str, Any]]:
    """The ``MixedStreams`` states in ``item``: loader states (with one per worker),
    mix states, or (nested) lists of them."""
    if isinstance(item, Mapping) and item.get("format") == FORMAT:
        yield item
    elif isinstance(item, Mapping) and "dataset_states" in item:
        yield from (s for s in item["dataset_states"].values() if s is not None)
    elif isinstance(item, Mapping) and "dataset_state" in item:
        yield item["dataset_state"]
    elif isinstance(item, (list, tuple)):
        for part in item:
            yield from consumer_states(part)


def elastic_streams(streams: Sequence[Any], states: Any) -> RunOfStreams | None:
    """The saved run, when every stream can be resumed from its consumers' states: the
    epoch, the saved shape, the count delivered, each saved consumer's mix state by its
    index. None when a stream cannot (the epoch then starts over).

    Raises:
        ValueError: for states of different runs, or what a stream's ``load_state_dict``
            raises (a saved consumer missing).
    """
    if not isinstance(states, (list, tuple)):
        return None
    found = [dict(s) for s in consumer_states(states)]
    if not found or not all(getattr(s, "resumes_from_consumer_states", False) for s in streams):
        return None
    mixes = [s["mix"] for s in found if s.get("mix") is not None]
    if not mixes:
        return None
    epochs = {int(m["epoch"]) for m in mixes}
    shapes = {int(m["consumers"]) for m in mixes}
    if len(epochs) > 1 or len(shapes) > 1:
        raise ValueError(
            f"MixedStreams: the states are of different runs (epochs {sorted(epochs)}, "
            f"consumers {sorted(shapes)})"
        )
    worlds = {int(m.get("world_size", 0)) for m in mixes}  # 0: a state that did not say
    (consumers,) = shapes  # a missing consumer: each stream's load_state_dict says so
    for i, stream in enumerate(streams):
        stream.load_state_dict([s["streams"][i] for s in found])
    return {
        "epoch": epochs.pop(),
        "consumers": consumers,
        "world_size": worlds.pop() if len(worlds) == 1 else 0,
        "delivered": sum(int(m["delivered"]) for m in mixes),
        "mixes": {int(m["consumer"]): m for m in mixes},
    }
