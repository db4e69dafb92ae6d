"""``DistributedRandomSampler``: each index once per epoch across ranks, reshuffled per epoch."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spdl.source import DistributedRandomSampler, detect_rank_and_world_size


def all_ranks(n: int, world_size: int, **kwargs: object) -> list[list[int]]:
    return [
        list(DistributedRandomSampler(n, rank=r, world_size=world_size, **kwargs))
        for r in range(world_size)
    ]


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 200),
    world_size=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 100),
    shuffle=st.booleans(),
)
def test_coverage_property(n: int, world_size: int, seed: int, epoch: int, shuffle: bool) -> None:
    def ranks(drop_last: bool) -> list[list[int]]:
        samplers = [
            DistributedRandomSampler(
                n, rank=r, world_size=world_size, seed=seed, shuffle=shuffle, drop_last=drop_last
            )
            for r in range(world_size)
        ]
        for s in samplers:
            s.set_epoch(epoch)
        out = [list(s) for s in samplers]
        assert [len(o) for o in out] == [len(s) for s in samplers]
        return out

    # drop_last=False: ceil(n / ws) each, every index at least once, only pads repeated.
    padded = ranks(drop_last=False)
    per_rank = -(-n // world_size)
    assert all(len(r) == per_rank for r in padded)
    counts = Counter(i for r in padded for i in r)
    assert set(counts) == set(range(n))
    assert sum(c - 1 for c in counts.values()) == per_rank * world_size - n  # the pads
    if n % world_size == 0:
        assert all(c == 1 for c in counts.values())

    # drop_last=True: n // ws each, disjoint, only the tail (n % ws indices) is missing.
    dropped = ranks(drop_last=True)
    assert all(len(r) == n // world_size for r in dropped)
    flat = [i for r in dropped for i in r]
    assert len(flat) == len(set(flat))
    assert set(flat) <= set(range(n))
    assert n - len(flat) == n % world_size


def test_each_index_once_when_n_divides() -> None:
    ranks = all_ranks(120, 4, seed=1)
    assert all(len(r) == 30 for r in ranks)
    assert sorted(i for r in ranks for i in r) == list(range(120))


def test_padding_repeats_the_start_of_the_permutation() -> None:
    ranks = all_ranks(10, 4, shuffle=False)
    assert ranks == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]


def test_drop_last_drops_the_tail() -> None:
    ranks = all_ranks(10, 4, shuffle=False, drop_last=True)
    assert ranks == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [
        len(DistributedRandomSampler(10, rank=r, world_size=4, drop_last=True)) for r in range(4)
    ] == [2] * 4


def test_shuffle_false_keeps_order() -> None:
    sampler = DistributedRandomSampler(20, rank=1, world_size=3, shuffle=False)
    sampler.set_epoch(5)
    assert list(sampler) == [1, 4, 7, 10, 13, 16, 19]


def test_set_epoch_reshuffles_and_the_same_epoch_repeats() -> None:
    sampler = DistributedRandomSampler(100, rank=0, world_size=1, seed=7)
    first = list(sampler)
    assert sorted(first) == list(range(100))
    assert list(sampler) == first  # same epoch, same order
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    assert sorted(second) == list(range(100))
    sampler.set_epoch(0)
    assert list(sampler) == first
    # Another sampler with the same seed and epoch agrees; another seed does not.
    assert list(DistributedRandomSampler(100, rank=0, world_size=1, seed=7)) == first
    assert list(DistributedRandomSampler(100, rank=0, world_size=1, seed=8)) != first


def test_rank_and_world_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert detect_rank_and_world_size() == (2, 3)
    sampler = DistributedRandomSampler(9, shuffle=False)
    assert (sampler.rank, sampler.world_size) == (2, 3)
    assert list(sampler) == [2, 5, 8]
    # Explicit arguments win over the environment.
    sampler = DistributedRandomSampler(9, rank=0, world_size=1, shuffle=False)
    assert list(sampler) == list(range(9))


@pytest.mark.usefixtures("single_process")
def test_defaults_to_a_single_process() -> None:
    assert detect_rank_and_world_size() == (0, 1)
    sampler = DistributedRandomSampler(5)
    assert (sampler.rank, sampler.world_size) == (0, 1)
    assert sorted(sampler) == list(range(5))


@pytest.mark.parametrize(("rank", "world_size"), [(2, 2), (-1, 2), (0, 0), (5, 3)], ids=str)
def test_invalid_rank(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError):
        DistributedRandomSampler(10, rank=rank, world_size=world_size)


def test_invalid_rank_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="invalid rank"):
        DistributedRandomSampler(10)


def test_negative_n() -> None:
    with pytest.raises(ValueError):
        DistributedRandomSampler(-1, rank=0, world_size=1)
