"""Sources: samplers that feed a pipeline, and the shapes SPDL code expects of them
(``spdl.source`` counterparts); ``torch_spdl.source.utils`` repeats and merges sources."""

from . import utils as utils
from ._deterministic import DistributedDeterministicSampler
from ._distributed import (
    DistributedRandomSampler,
    detect_rank_and_world_size,
    resolve_rank_and_world_size,
)
from ._types import IterableWithShuffle, SizedIterable

__all__ = [
    "DistributedDeterministicSampler",
    "DistributedRandomSampler",
    "IterableWithShuffle",
    "SizedIterable",
    "detect_rank_and_world_size",
    "resolve_rank_and_world_size",
]
