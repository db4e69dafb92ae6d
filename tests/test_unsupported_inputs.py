"""Inputs a public entry point cannot handle are refused with an error that names them.

Each case here used to fail deep inside with an ``AttributeError`` or a bare ``len()``
error; the checks that replaced those also let the type checker follow the code.
"""

from __future__ import annotations

import pytest
from torch.utils.data import Dataset

from torch_spdl.lightning import StagedDataModule
from torch_spdl.pipeline import PipelineBuilder, profile_pipeline
from torch_spdl.pipeline.defs import Pipe


def _double(x: int) -> int:
    return 2 * x


def _parity(x: int) -> int:
    return x % 2


def test_profile_pipeline_refuses_a_path_variants_stage_by_name():
    builder = (
        PipelineBuilder()
        .add_source(range(8))
        .path_variants(_parity, [[Pipe(_double)], [Pipe(_double)]], name="split")
        .add_sink(2)
    )
    with pytest.raises(TypeError, match=r"profile_pipeline: stage 1:split \(PathVariantsConfig\)"):
        profile_pipeline(builder, num_iterations=4, concurrency_levels=(1,), file=None)


class _Unsized(Dataset):
    def __getitem__(self, index: int) -> int:
        return index


def test_datamodule_refuses_a_train_dataset_without_length():
    module = StagedDataModule(train=_Unsized(), batch_size=2)
    with pytest.raises(TypeError, match="train dataset .* has no length"):
        module.train_dataloader()
