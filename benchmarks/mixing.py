"""What a weighted mix and its elastic resume cost: the global order, a rank's share,
a rank's state, and merging every rank's state.

Run: ``python benchmarks/mixing.py [--quick]``. Prints a Markdown table; asserts nothing.

Why: a mix computes each epoch's global order on every rank (as ``DistributedSampler``
draws its permutation on every rank), and a resume merges the states of all ranks. The
table says what that costs at a few epoch sizes, against torch's ``randperm`` of the same
length (the permutation torch's ``DistributedSampler`` draws), so that the order's cost
reads as a multiple of what a sampler already pays. One process, no loader: these are the
costs the sampler adds, not a loader's throughput.
"""

from __future__ import annotations

import argparse
import pickle
import time
from collections.abc import Callable

import torch

from torch_spdl.source import MixedSampler, WeightedMix, merge_states


def _best(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` runs, in seconds (the least disturbed by the machine)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _row(length: int, world: int, repeats: int) -> str:
    lengths = [length * 6 // 10, length * 3 // 10, length - length * 9 // 10]
    mix = WeightedMix([range(n) for n in lengths], [0.5, 0.3, 0.2], policy="cycle", seed=1)
    order_s = _best(lambda: mix.order(0), repeats)
    perm_s = _best(lambda: torch.randperm(mix.samples_per_epoch()), repeats)
    samplers = [MixedSampler(mix, rank=r, world_size=world) for r in range(world)]
    share_s = _best(samplers[0].share, repeats)
    per_rank = len(samplers[0])
    states = [s.state_dict(per_rank // 3 + (r % 3)) for r, s in enumerate(samplers)]
    state_bytes = len(pickle.dumps(states[0]))
    merge_s = _best(lambda: merge_states(states), repeats)
    return (
        f"| {mix.samples_per_epoch():,} | {world} | {order_s * 1e3:,.0f} | "
        f"{perm_s * 1e3:,.0f} | {share_s * 1e3:,.0f} | {state_bytes:,} | {merge_s * 1e3:,.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small epochs, one repeat")
    args = parser.parse_args()
    sizes = [100_000, 1_000_000] if args.quick else [100_000, 1_000_000, 10_000_000]
    repeats = 1 if args.quick else 3
    print(
        "| epoch (samples) | ranks | global order, ms | torch.randperm, ms | "
        "a rank's share, ms | a rank's state, bytes | merging all ranks' states, ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in sizes:
        for world in (8, 64):
            print(_row(size, world, repeats), flush=True)


if __name__ == "__main__":
    main()
