"""Index batches for an epoch, with a lighter path for torch's shuffled BatchSampler.

torch's ``RandomSampler`` turns the whole permutation into a Python list up front (2M
indices: about 75 MiB of int objects for the epoch). For the common case, a plain
``BatchSampler`` over a plain ``RandomSampler`` without replacement, the same permutation
(same random draws, in the same order) is kept as a tensor and turned into lists one batch
at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler

__all__ = ["index_batches"]


def index_batches(index_sampler: Any) -> Iterator[Any]:
    """An iterator over the epoch's index batches, equal to ``iter(index_sampler)``."""
    if type(index_sampler) is BatchSampler:
        sampler = index_sampler.sampler
        if (
            type(sampler) is RandomSampler
            and not sampler.replacement
            and sampler.num_samples == len(sampler.data_source)
        ):
            return _shuffled_batches(sampler, index_sampler.batch_size, index_sampler.drop_last)
    return iter(index_sampler)


def _shuffled_batches(sampler: RandomSampler, size: int, drop_last: bool) -> Iterator[list[int]]:
    n = len(sampler.data_source)
    generator = sampler.generator
    if generator is None:  # the draw RandomSampler makes from the global RNG
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    perm = torch.randperm(n, generator=generator)
    full = n // size * size
    for start in range(0, full, size):
        yield perm[start : start + size].tolist()
    if n % size and not drop_last:
        yield perm[full:].tolist()
    # RandomSampler draws one more permutation when its iterator is run to the end; keep
    # the generator's state where torch leaves it, so later epochs draw the same.
    torch.randperm(n, generator=generator)
