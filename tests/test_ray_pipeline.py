"""``PipelineBuilder.to(RayActors(...))`` on a real Ray cluster: a region run in actors.

One cluster for the module (a head with no CPU and two worker nodes of one CPU each, on
loopback, in a network namespace of this process's own: ``torch_spdl.ray_local``). Every
region asks for the ``"remote"`` resource, so its actors run on the worker nodes, in other
processes than this one. Each result is compared with the same pipeline run without
``to()``; faults are real (an actor's process killed mid-run).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from torch_spdl.pipeline import PipelineBuilder, PipelineFailure, RayActors  # noqa: E402
from torch_spdl.pipeline.defs import MAIN_PROCESS  # noqa: E402
from torch_spdl.ray_local import LocalCluster, actors_alive, wait_actors_gone  # noqa: E402

# The ops below live in this module, which Ray's workers cannot import: they travel by
# value, as a script's own functions (defined in __main__) do.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Half a node each: two actors fit on one worker node, so a replacement has room.
REMOTE: dict[str, Any] = {"resources": {"remote": 0.5}, "num_cpus": 0.5}


PREFIX = "torch_spdl-region-"


def our_actors() -> list[str]:
    """The names of our region actors alive in the cluster."""
    return actors_alive(PREFIX)


def no_actor_left() -> bool:
    """Whether every region actor is gone (``ray.kill`` lands asynchronously: waited for)."""
    return wait_actors_gone(PREFIX) == []


# -- ops -----------------------------------------------------------------------------------
def square(x: int) -> int:
    return x * x


def tag(x: int) -> tuple[int, int]:
    return x, os.getpid()


async def plus_one(x: int) -> int:
    return x + 1


def fail_on_tens(x: int) -> int:
    if x % 10 == 0:
        raise ValueError(f"bad item {x}")
    return x


def as_tensor(x: int) -> dict[str, torch.Tensor]:
    return {"image": torch.full((3, 8, 8), float(x)), "label": torch.tensor([x, -x])}


def build(region: RayActors | None, *stages: Any, n: int = 500, **options: Any) -> Any:
    builder = PipelineBuilder().add_source(range(n))
    if region is not None:
        builder = builder.to(region)
    for op, kwargs in stages:
        builder = builder.pipe(op, **kwargs)
    if region is not None:
        builder = builder.to(MAIN_PROCESS)
    return builder.add_sink(16).build(**options)


# -- tests ---------------------------------------------------------------------------------
def test_results_and_order_equal_the_pipeline_without_to(cluster: LocalCluster) -> None:
    stages = [(square, {"concurrency": 4, "output_order": "input"}), (plus_one, {})]
    expected = list(build(None, *stages))
    pipeline = build(RayActors(2, **REMOTE), *stages)
    assert list(pipeline) == expected  # in order, every item once
    region = pipeline.get_stats()[1]
    assert region.name.startswith("1:ray_actors[2]")
    assert region.num_in == region.num_out == 500 and region.num_failed == 0
    assert no_actor_left()


def test_the_stages_run_in_actors_elsewhere(cluster: LocalCluster) -> None:
    got = list(build(RayActors(2, **REMOTE), (tag, {}), n=300))
    assert [x for x, _ in got] == list(range(300))
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert no_actor_left()


def test_tensors_come_back_intact(cluster: LocalCluster) -> None:
    got = list(build(RayActors(2, **REMOTE), (as_tensor, {}), n=100))
    assert len(got) == 100
    for x, batch in enumerate(got):
        assert torch.equal(batch["image"], torch.full((3, 8, 8), float(x)))
        assert torch.equal(batch["label"], torch.tensor([x, -x]))
        batch["image"] += 1  # the consumer's to change
    assert no_actor_left()


def test_remote_failures_count_against_max_failures_and_in_stats(cluster: LocalCluster) -> None:
    pipeline = build(RayActors(2, **REMOTE), (fail_on_tens, {}), n=200, max_failures=20)
    assert list(pipeline) == [x for x in range(200) if x % 10]
    region = pipeline.get_stats()[1]
    assert (region.num_in, region.num_out, region.num_failed) == (200, 180, 20)

    over = build(RayActors(2, **REMOTE), (fail_on_tens, {}), n=200, max_failures=19)
    with pytest.raises(PipelineFailure) as info:
        list(over)
    (error,) = info.value.exceptions
    assert isinstance(error, ValueError) and str(error).startswith("bad item")
    notes = "\n".join(error.__notes__)
    assert "failed on item" in notes and "20 failures, more than max_failures=19" in notes
    assert "traceback in the Ray actor" in notes and "fail_on_tens" in notes
    assert no_actor_left()


def test_a_user_exception_names_the_stage_and_the_item(cluster: LocalCluster) -> None:
    pipeline = build(RayActors(1, **REMOTE), (fail_on_tens, {"name": "check"}), n=5, max_failures=0)
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    (error,) = info.value.exceptions
    assert isinstance(error, ValueError) and str(error) == "bad item 0"
    notes = "\n".join(error.__notes__)
    assert "stage '1:check'" in notes and "failed on item 0" in notes
    assert no_actor_left()


def die_once(marker: str) -> Any:
    """An op whose actor's process dies on item 250, the first time only."""

    def op(x: int) -> int:
        if x == 250 and not os.path.exists(marker):
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    return op


def test_a_killed_actor_is_replaced_and_nothing_is_lost_or_doubled(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    marker = str(tmp_path / "died")
    pipeline = build(RayActors(2, **REMOTE), (die_once(marker), {}), (square, {}))
    assert list(pipeline) == [x * x for x in range(500)]
    assert os.path.exists(marker)  # it did die
    assert no_actor_left()


def test_out_of_replacements_fails_the_pipeline(cluster: LocalCluster) -> None:
    def always_die(x: int) -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return x

    pipeline = build(RayActors(1, max_replacements=1, **REMOTE), (always_die, {}), n=10)
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    (error,) = info.value.exceptions
    assert "the budget of 1 replacements is spent" in str(error)
    assert no_actor_left()


def test_stop_kills_every_actor(cluster: LocalCluster) -> None:
    pipeline = build(RayActors(2, **REMOTE), (square, {}), n=10_000)
    with pipeline.auto_stop():
        first = [pipeline.get_item() for _ in range(10)]
        assert len(our_actors()) == 2
    assert first == [x * x for x in range(10)]
    assert no_actor_left()


def test_the_declaration_is_checked() -> None:
    with pytest.raises(ValueError, match="num_actors"):
        RayActors(0)
    with pytest.raises(ValueError, match="max_restarts"):
        RayActors(1, max_restarts=3)
    with pytest.raises(ValueError, match="aggregate"):
        PipelineBuilder().add_source(range(3)).to(RayActors(1)).aggregate(2).build()
    assert RayActors(2, num_cpus=2) == RayActors(2, num_cpus=2) != RayActors(2)
