"""Sources: samplers that feed a pipeline (``spdl.source`` counterparts)."""

from ._distributed import DistributedRandomSampler, detect_rank_and_world_size

__all__ = ["DistributedRandomSampler", "detect_rank_and_world_size"]
