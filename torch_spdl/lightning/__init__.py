"""Lightning integration: a DataModule for staged datasets, resumable mid-epoch.

``torch_spdl.DataLoader`` already works inside any ``LightningDataModule`` (it is a torch
DataLoader). :class:`StagedDataModule` goes further: give it datasets (or a ``load`` /
``process`` pair and keys) and per-stage concurrency, and it builds the train / val / test /
predict loaders, shards training with :class:`~torch_spdl.source.DistributedRandomSampler`
when the Trainer is distributed (a ``torch_spdl.source.WeightedMix`` with
:class:`LightningMixedSampler`), and checkpoints exactly the batches the model consumed,
resumable on another number of GPUs.
See ``docs/lightning.md``.
"""

from ._datamodule import FunctionDataset, LightningDistributedRandomSampler, StagedDataModule
from ._rank_states import LightningMixedSampler

__all__ = [
    "FunctionDataset",
    "LightningDistributedRandomSampler",
    "LightningMixedSampler",
    "StagedDataModule",
]
