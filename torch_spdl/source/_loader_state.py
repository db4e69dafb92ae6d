"""``elastic_state(loader)``: a rank's elastic state, read from a ``torch_spdl.DataLoader``.

A sampler cannot know what the training loop received: a loader fetches ahead of it.
``torch_spdl.DataLoader`` counts the batches it delivered (its ``state_dict()``: a
watermark of batches and the few delivered out of order; for a stateful iterable dataset,
each worker's own state as of its last batch received), so the rank's state is made from
that count and the loader's batch size. torch's own loader counts nothing: there the
script passes what it counted (``sampler.state_dict(delivered=steps * batch_size)``).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data import BatchSampler

from ._elastic_sampler import ElasticSampler
from ._mixed_iterable import MixedIterableDataset

__all__ = ["elastic_state"]


def elastic_state(loader: Any) -> dict[str, Any]:
    """This rank's elastic resume state, from a ``torch_spdl.DataLoader`` whose sampler is
    an :class:`ElasticSampler` (``DistributedRandomSampler``, ``MixedSampler``) or whose
    dataset is a :class:`MixedIterableDataset`.

    Save it on every rank (or gather it); the list of all ranks' states, loaded into the
    sampler (or dataset) of a fresh loader at any world size and worker count, resumes the
    epoch with exactly the samples not delivered. Batches the loader had fetched ahead and
    not delivered count as not delivered.

    Take it while the epoch runs (or after it, before ``set_epoch`` of the next): once
    the loader's iterator of an epoch is gone, the loader no longer says what it
    delivered; a sampler that gave out every index then counts the epoch as delivered,
    else nothing, with a warning; a ``MixedIterableDataset`` counts nothing (a resume of
    another epoch ignores the state anyway).

    Args:
        loader: the rank's ``torch_spdl.DataLoader``.

    Raises:
        TypeError: for a loader without ``state_dict`` (torch's: pass
            ``sampler.state_dict(delivered=...)``), a sampler or dataset that is not
            elastic, or a custom ``batch_sampler``.
    """
    if not callable(getattr(loader, "state_dict", None)):
        raise TypeError(
            f"{type(loader).__name__} does not count the batches it delivered: use "
            "torch_spdl.DataLoader, or pass sampler.state_dict(delivered=steps * batch_size)"
        )
    state = loader.state_dict()
    dataset = loader.dataset
    if isinstance(dataset, MixedIterableDataset):
        return dataset.rank_state(dataset.worker_counts(state, loader.num_workers))
    sampler = loader.sampler
    if not isinstance(sampler, ElasticSampler):
        raise TypeError(
            "elastic_state needs a loader whose sampler is an ElasticSampler "
            "(DistributedRandomSampler, MixedSampler) or whose dataset is a "
            f"MixedIterableDataset; got sampler {type(sampler).__name__}"
        )
    size = loader.batch_size or 1
    if loader.batch_size is not None and not (
        type(loader.batch_sampler) is BatchSampler and loader.batch_sampler.sampler is sampler
    ):
        raise TypeError(
            "elastic_state counts batches of batch_size indices of the sampler: a custom "
            "batch_sampler cannot be counted (pass sampler.state_dict(delivered=...))"
        )
    share = len(sampler)
    if sampler._iterated != sampler.epoch:
        return sampler.state_dict(0)  # the sampler's epoch has not started in this loader
    if state.get("rng_state") is None:  # the loader's iterator of the epoch is gone
        if sampler._finished == sampler.epoch:
            return sampler.state_dict(share)  # it gave out every index: the epoch ended
        warnings.warn(
            "elastic_state: the loader's iterator of this epoch is gone before the sampler "
            "gave out all its indices (a break?): what it delivered is unknown, and the "
            "state counts nothing as delivered (take the state while the epoch runs)",
            stacklevel=2,
        )
        return sampler.state_dict(0)
    if state.get("exhausted"):
        return sampler.state_dict(share)
    extra = [j for b in state.get("extra", ()) for j in range(b * size, min((b + 1) * size, share))]
    return sampler.state_dict(min(int(state["delivered"]) * size, share), extra=extra)
