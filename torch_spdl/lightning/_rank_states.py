"""What ``StagedDataModule`` needs to resume on another number of GPUs.

Lightning writes the checkpoint from rank 0 only, so rank 0's DataModule state must hold
every rank's elastic state (``torch_spdl.source.elastic_state``): they are gathered with
``all_gather_object`` when the checkpoint is made (Lightning builds it on every rank).
On a resume, the saved shape (world size, and workers per rank for an iterable mix) is
compared with the new one: the same shape resumes through the loader's own state (the
same batches as without the stop), another shape through the merged states, the loader's
own state then set aside, since it counts batches of the old shares.

``LightningMixedSampler`` is :class:`~torch_spdl.source.MixedSampler` answering
``isinstance(..., DistributedSampler)``, as ``LightningDistributedRandomSampler`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ..source import ElasticSampler, MixedIterableDataset, MixedSampler, elastic_state

__all__ = [
    "LightningMixedSampler",
    "elastic_target",
    "gather_states",
    "other_world",
    "same_shape",
]


# DistributedSampler is a base only for Lightning's isinstance check (see
# LightningDistributedRandomSampler): its __init__ never runs.
class LightningMixedSampler(MixedSampler, DistributedSampler):
    """:class:`~torch_spdl.source.MixedSampler` that Lightning recognises as already
    distributed (it would otherwise shard the mix's shares a second time)."""

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return self.world_size


def elastic_target(loader: Any) -> ElasticSampler | MixedIterableDataset | None:
    """What takes the elastic states of ``loader``: its sampler or its dataset, if elastic."""
    if isinstance(loader.dataset, MixedIterableDataset):
        return loader.dataset
    sampler = getattr(loader, "sampler", None)
    return sampler if isinstance(sampler, ElasticSampler) else None


def gather_states(loader: Any) -> list[dict[str, Any]] | None:
    """Every rank's elastic state (this rank's alone outside ``torch.distributed``); None
    when the loader is not elastic. A collective: every rank must call it."""
    if elastic_target(loader) is None:
        return None
    own = elastic_state(loader)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [own]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, own)
    return states


def same_shape(states: Sequence[dict[str, Any]], loader: Any) -> bool:
    """Whether ``loader`` deals at the shape the states were saved at (the world size;
    for an iterable mix, the workers per rank too)."""
    first = states[0]
    target = elastic_target(loader)
    if target is None:
        return True
    if int(first["split"]["world_size"]) != target.world_size:
        return False
    if isinstance(target, MixedIterableDataset):
        return int(first["consumers"][0]["num_workers"]) == max(loader.num_workers, 1)
    return True


def other_world(state: Mapping[str, Any], world_size: int) -> bool:
    """Whether a DataModule state holds elastic states saved at another world size."""
    states = state.get("elastic")
    if not states:
        return False
    return int(states[0]["split"]["world_size"]) != world_size
