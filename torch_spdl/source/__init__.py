"""Sources: samplers that feed a pipeline, and the shapes SPDL code expects of them
(``spdl.source`` counterparts); ``torch_spdl.source.utils`` repeats and merges sources.

Mixing and elastic resume (docs/mixing.md): :class:`WeightedMix` mixes map-style datasets
by weight into one global order per ``(seed, epoch)``, dealt to ranks by
:class:`MixedSampler` (or :class:`MixedIterableDataset`, which also deals to workers);
:class:`MixedStreams` mixes streams. Every :class:`ElasticSampler`
(:class:`DistributedRandomSampler` too) saves a rank's state in a few numbers, and the
list of all ranks' states resumes the epoch on any number of ranks and workers
(:func:`elastic_state`, :func:`merge_states`).
"""

from . import utils as utils
from ._deterministic import DistributedDeterministicSampler
from ._distributed import (
    DistributedRandomSampler,
    detect_rank_and_world_size,
    resolve_rank_and_world_size,
)
from ._elastic import ResumePoint
from ._elastic import merge as merge_states
from ._elastic_sampler import ElasticSampler
from ._loader_state import elastic_state
from ._mixed_iterable import MixedIterableDataset
from ._mixed_sampler import MixedSampler
from ._mixed_streams import MixedStreams
from ._types import EpochStream, IterableWithShuffle, SizedIterable
from ._weighted_mix import WeightedMix

__all__ = [
    "DistributedDeterministicSampler",
    "DistributedRandomSampler",
    "ElasticSampler",
    "EpochStream",
    "IterableWithShuffle",
    "MixedIterableDataset",
    "MixedSampler",
    "MixedStreams",
    "ResumePoint",
    "SizedIterable",
    "WeightedMix",
    "detect_rank_and_world_size",
    "elastic_state",
    "merge_states",
    "resolve_rank_and_world_size",
]
