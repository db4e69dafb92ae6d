"""Which shards each consumer reads in an epoch, and in what order.

A consumer is one (rank, DataLoader worker) pair. Every consumer computes the same
epoch order of the whole shard list from ``(seed, epoch)`` alone (a ``random.Random`` of
its own, never the global RNG), then takes every ``C``-th shard of it, ``C`` being the
number of consumers: consumer ``worker * world_size + rank`` starts at that position, so
the workers of one rank together read that rank's share whatever their number (as
``torch_spdl.PipelineDataset`` splits a source).

When ``C`` does not divide the shard count, the split is evened out as torch's
``DistributedSampler`` evens out indices: ``drop_last=False`` repeats shards from the
start of the epoch's order so that every consumer gets ``ceil(n / C)`` shards, and
``drop_last=True`` leaves the last ``n % C`` out so that every consumer gets ``n // C``.
Training under DDP needs every rank to make the same number of steps, which equal shard
counts give when the shards hold equal sample counts (as WebDataset's writers make them).
``even_out=False`` splits exactly: every shard once, some consumers one more.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Consumer", "epoch_order", "shards_of"]


@dataclass(frozen=True)
class Consumer:
    """One reader of the shard list: a rank's DataLoader worker."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @property
    def index(self) -> int:
        return self.worker * self.world_size + self.rank

    @property
    def count(self) -> int:
        return self.world_size * self.num_workers


def epoch_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order of all shards in ``epoch``: the same on every rank and worker."""
    order = list(range(num_shards))
    if shuffle:
        random.Random(f"torch_spdl.streaming:{seed}:{epoch}").shuffle(order)
    return order


def shards_of(
    consumer: Consumer,
    num_shards: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    even_out: bool,
) -> list[int]:
    """The shard indices ``consumer`` reads in ``epoch``, in reading order."""
    order = epoch_order(num_shards, seed, epoch, shuffle)
    count = consumer.count
    if even_out and num_shards % count:
        if drop_last:
            order = order[: num_shards - num_shards % count]
        elif order:
            total = -(-num_shards // count) * count
            order = (order * (-(-total // num_shards)))[:total]
    return order[consumer.index :: count]
