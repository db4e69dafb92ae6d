"""``BuildOptions``: one set of build options, taken by every entry point that builds."""

from __future__ import annotations

import dataclasses

import pytest

from torch_spdl.pipeline import (
    BuildOptions,
    PipelineBuilder,
    build_pipeline,
    run_pipeline_in_subprocess,
)


def _double(x: int) -> int:
    return 2 * x


def _config():  # noqa: ANN202
    return PipelineBuilder().add_source(range(10)).pipe(_double, concurrency=2).get_config()


def test_options_build_like_the_same_keywords() -> None:
    options = BuildOptions(num_threads=1, max_failures=0, queue_size=2)
    by_options = build_pipeline(_config(), options=options)
    by_keywords = build_pipeline(_config(), num_threads=1, max_failures=0, queue_size=2)
    with by_options.auto_stop(), by_keywords.auto_stop():
        assert sorted(by_options) == sorted(by_keywords) == [2 * i for i in range(10)]


def test_options_are_frozen_and_checked_at_build() -> None:
    options = BuildOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_threads = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="num_threads"):
        build_pipeline(_config(), options=BuildOptions(num_threads=0))


def test_options_and_keywords_together_are_refused() -> None:
    with pytest.raises(TypeError, match="not both"):
        build_pipeline(_config(), num_threads=1, options=BuildOptions())


def test_the_subprocess_runner_refuses_an_unknown_option_before_starting() -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        run_pipeline_in_subprocess(_config(), no_such_option=1)
