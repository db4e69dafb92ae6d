"""Weighted mixing and elastic resume, as properties (hypothesis, no processes).

For random lengths, weights, policies, seeds, world sizes, worker counts and resume
points: an epoch holds what its policy promises; across ranks x workers every position of
the global order is dealt once; and the states of every rank at (W, K), loaded at
(W', K'), deal exactly what was not delivered. Loader processes are in
tests/test_mixing_loaders.py.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from torch_spdl.source import (
    DistributedRandomSampler,
    MixedIterableDataset,
    MixedSampler,
    WeightedMix,
    merge_states,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICIES = ("first_exhausted", "cycle", "all_exhausted")


@st.composite
def mixes(draw: st.DrawFn, *, nonempty: bool = False) -> WeightedMix:
    count = draw(st.integers(1, 4))
    low = 1 if nonempty else 0
    lengths = draw(st.lists(st.integers(low, 30), min_size=count, max_size=count))
    policy = draw(st.sampled_from(POLICIES))
    if policy == "cycle":
        lengths = [max(n, 1) for n in lengths]
    assume(sum(lengths) > 0)
    weights = draw(
        st.none()
        | st.lists(st.floats(0.05, 20), min_size=count, max_size=count)
        | st.lists(st.integers(1, 9).map(float), min_size=count, max_size=count)
    )
    epoch_length = draw(st.none() | st.integers(0, 90))
    shuffle = draw(st.booleans() | st.lists(st.booleans(), min_size=count, max_size=count))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an epoch length a policy cuts is warned about
        return WeightedMix(
            [range(n) for n in lengths],
            weights,
            policy=policy,
            epoch_length=epoch_length,
            shuffle=shuffle,
            seed=draw(st.integers(0, 2**31)),
        )


def _by_source(mix: WeightedMix, order: list[int]) -> list[list[int]]:
    """Each source's local indices, in the order the epoch draws them."""
    out: list[list[int]] = [[] for _ in mix.datasets]
    for index in order:
        source, local = mix.locate(index)
        out[source].append(local)
    return out


def _weights(mix: WeightedMix) -> list[float]:
    return list(mix.weights)


@FAST
@given(mix=mixes(), epoch=st.integers(0, 50))
def test_an_epoch_holds_what_its_policy_promises(mix: WeightedMix, epoch: int) -> None:
    order = mix.order(epoch).tolist()
    quotas = mix.quotas()
    lengths = mix.lengths
    assert len(order) == mix.samples_per_epoch() == sum(quotas)
    assert order == mix.order(epoch).tolist()  # deterministic for (seed, epoch)
    for source, (quota, local, n) in enumerate(
        zip(quotas, _by_source(mix, order), lengths, strict=True)
    ):
        assert len(local) == quota
        # the source's own order: whole passes, each a permutation (index order unshuffled)
        for start in range(0, quota, max(n, 1)):
            chunk = local[start : start + n]
            if mix.shuffle[source]:
                assert len(set(chunk)) == len(chunk) and set(chunk) <= set(range(n))
            else:
                assert chunk == list(range(len(chunk)))
    w = _weights(mix)
    total = sum(quotas)
    asked = mix.epoch_length
    if mix.policy == "all_exhausted":
        assert all(q <= n for q, n in zip(quotas, lengths, strict=True))
        if asked is None or asked >= sum(lengths):
            assert quotas == lengths  # every sample of every source once
        else:
            assert total == asked
            free = [i for i, (q, n) in enumerate(zip(quotas, lengths, strict=True)) if q < n]
            rest = total - sum(q for i, q in enumerate(quotas) if i not in free)
            for i in free:  # the sources not capped share the rest by weight
                assert abs(quotas[i] - rest * w[i] / sum(w[j] for j in free)) < 1
    else:
        for q, wi in zip(quotas, w, strict=True):  # in proportion, to within one sample
            assert abs(q - total * wi / sum(w)) < 1
    if mix.policy == "first_exhausted":
        assert all(q <= n for q, n in zip(quotas, lengths, strict=True))  # no sample twice
        if asked is None or asked > total:  # it stopped where a source ran out
            assert any(q >= n - 1 for q, n in zip(quotas, lengths, strict=True))
    if mix.policy == "cycle":
        if asked is None:  # every source gave all it has, the longest no more than needed
            assert all(q >= n for q, n in zip(quotas, lengths, strict=True))
            assert any(q <= n + 1 for q, n in zip(quotas, lengths, strict=True))
        else:
            assert total == asked


@FAST
@given(
    lengths=st.lists(st.integers(40, 120), min_size=2, max_size=3),
    weights=st.lists(st.floats(0.2, 5), min_size=3, max_size=3),
    seed=st.integers(0, 2**31),
)
def test_all_exhausted_keeps_the_weights_until_a_source_runs_out(
    lengths: list[int], weights: list[float], seed: int
) -> None:
    weights = weights[: len(lengths)]
    mix = WeightedMix([range(n) for n in lengths], weights, policy="all_exhausted", seed=seed)
    sources = [mix.locate(i)[0] for i in mix.order(0).tolist()]
    # Up to where the first source runs out, the sources come in the weights'
    # proportions (to within the shuffle's spread, a few standard deviations).
    end = min(len(sources) - sources[::-1].index(s) for s in range(len(lengths)))
    head = Counter(sources[:end])
    assert any(head[s] == lengths[s] for s in range(len(lengths)))
    for s, w in enumerate(weights):
        assert abs(head[s] - end * w / sum(weights)) <= 4 * end**0.5 + 2


def _expected_dealt(order: list[int], world: int, even_out: bool, drop_last: bool) -> Counter:
    """What ranks together take of ``order``: each once, padded or trimmed when evened."""
    if not even_out or not order:
        return Counter(order)
    if drop_last:
        return Counter(order[: len(order) - len(order) % world])
    pad = -len(order) % world
    return Counter(order + (order * (pad // len(order) + 1))[:pad])


@FAST
@given(
    mix=mixes(),
    world=st.integers(1, 5),
    workers=st.integers(1, 4),
    block=st.integers(1, 5),
    even_out=st.booleans(),
    drop_last=st.booleans(),
    epoch=st.integers(0, 9),
)
def test_ranks_and_workers_together_take_the_order_once(
    mix: WeightedMix,
    world: int,
    workers: int,
    block: int,
    even_out: bool,
    drop_last: bool,
    epoch: int,
) -> None:
    order = mix.order(epoch).tolist()
    dealt: Counter = Counter()
    per_rank = []
    for rank in range(world):
        kw = dict(rank=rank, world_size=world, even_out=even_out, drop_last=drop_last)
        sampler = MixedSampler(mix, **kw)
        sampler.set_epoch(epoch)
        share = list(sampler)
        assert len(share) == len(sampler)
        per_rank.append(len(share))
        dataset = MixedIterableDataset(mix, batch_size=block, **kw)
        dataset.set_epoch(epoch)
        by_worker = [dataset.indices(k, workers) for k in range(workers)]
        assert sorted(sum(by_worker, [])) == sorted(share)  # the workers split the rank's share
        dealt.update(share)
    assert dealt == _expected_dealt(order, world, even_out, drop_last)
    if even_out:
        assert len(set(per_rank)) == 1  # DDP: every rank the same number of steps


def _prefix_states(shares: list[list[int]], fractions: list[float]) -> list[int]:
    return [int(f * len(s)) for s, f in zip(shares, fractions, strict=False)]


@FAST
@given(
    mix=mixes(nonempty=True),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    new_world=st.integers(1, 4),
    new_workers=st.integers(1, 3),
    block=st.integers(1, 4),
    fractions=st.lists(st.floats(0, 1), min_size=12, max_size=12),
    even_out=st.booleans(),
)
def test_resume_on_another_shape_deals_exactly_the_rest(
    mix: WeightedMix,
    world: int,
    workers: int,
    new_world: int,
    new_workers: int,
    block: int,
    fractions: list[float],
    even_out: bool,
) -> None:
    """Each worker of each rank delivered a prefix of its own sequence (a loader in
    torch's order delivers that); the rest, dealt at (W', K'), is what none delivered."""
    order = mix.order(3).tolist()
    delivered: Counter = Counter()
    states = []
    for rank in range(world):
        dataset = MixedIterableDataset(
            mix, rank=rank, world_size=world, batch_size=block, even_out=even_out
        )
        dataset.set_epoch(3)
        sequences = [dataset.indices(k, workers) for k in range(workers)]
        counts = _prefix_states(sequences, fractions[rank * 3 : rank * 3 + workers])
        for seq, n in zip(sequences, counts, strict=True):
            delivered.update(seq[:n])
        states.append(dataset.rank_state(counts))
    point = merge_states(states)
    rest: Counter = Counter()
    for rank in range(new_world):
        dataset = MixedIterableDataset(
            mix, rank=rank, world_size=new_world, batch_size=block, even_out=False
        )
        dataset.load_state_dict(states)
        assert dataset.epoch == 3
        for k in range(new_workers):
            rest.update(dataset.indices(k, new_workers))
    # every position of the order: delivered (padding may deliver some twice) or dealt now
    positions = Counter(order)
    assert rest == positions - delivered if not even_out else rest + delivered >= positions
    assert sum(rest.values()) == point.delivered.remaining
    if not even_out:
        assert rest + delivered == positions  # nothing lost, nothing twice
    else:  # a padded share repeats the start of the order: only positions delivered twice
        assert not (rest & (delivered - positions))
        assert sum((rest + delivered - positions).values()) < world


@FAST
@given(
    n=st.integers(1, 80),
    world=st.integers(1, 5),
    new_world=st.integers(1, 5),
    newer_world=st.integers(1, 5),
    seed=st.integers(0, 2**20),
    fractions=st.lists(st.floats(0, 1), min_size=10, max_size=10),
    drop_last=st.booleans(),
)
def test_distributed_random_sampler_resumes_twice_on_other_world_sizes(
    n: int,
    world: int,
    new_world: int,
    newer_world: int,
    seed: int,
    fractions: list[float],
    drop_last: bool,
) -> None:
    """W -> W' -> W'': the indices delivered over the three stretches, plus what the last
    deals, are the epoch's, each once (padding and trimming aside, at most W-1 per stretch)."""
    delivered: Counter = Counter()
    states = None
    for stretch, w in enumerate((world, new_world, newer_world)):
        samplers = [
            DistributedRandomSampler(n, rank=r, world_size=w, seed=seed, drop_last=drop_last)
            for r in range(w)
        ]
        for s in samplers:
            s.set_epoch(5)
            if states is not None:
                s.load_state_dict(states)
        shares = [list(s) for s in samplers]
        assert len({len(x) for x in shares}) == 1
        if stretch == 2:
            rest = Counter(sum(shares, []))
            break
        counts = _prefix_states(shares, fractions[stretch * 5 : stretch * 5 + w])
        for share, c in zip(shares, counts, strict=True):
            delivered.update(share[:c])
        states = [s.state_dict(c) for s, c in zip(samplers, counts, strict=True)]
    every = Counter(range(n))
    union = rest + delivered
    if not drop_last:
        assert not (every - union)  # nothing lost
    # what is twice: padding only, fewer than a world's worth per stretch
    assert sum((union - every).values()) < world + new_world + newer_world
    assert set(union) <= set(every)


@FAST
@given(
    mix=mixes(nonempty=True),
    world=st.integers(1, 4),
    fractions=st.lists(st.floats(0, 1), min_size=4, max_size=4),
)
def test_an_out_of_order_delivery_is_recorded_exactly(
    mix: WeightedMix, world: int, fractions: list[float]
) -> None:
    """``extra``: positions delivered past a rank's first undelivered one (in_order=False)."""
    samplers = [MixedSampler(mix, rank=r, world_size=world, even_out=False) for r in range(world)]
    delivered: Counter = Counter()
    states = []
    for s, f in zip(samplers, fractions, strict=False):
        share = list(s)
        first = int(f * len(share))
        extra = list(range(first + 1, len(share), 2))  # every other one past a gap
        delivered.update(share[:first] + [share[j] for j in extra])
        states.append(s.state_dict(first, extra=extra))
    again = MixedSampler(mix, rank=0, world_size=1, even_out=False)
    again.load_state_dict(states)
    assert Counter(list(again)) + delivered == Counter(mix.order(0).tolist())


def test_a_missing_rank_or_another_mix_is_refused() -> None:
    mix = WeightedMix([range(10), range(5)], [2.0, 1.0], seed=1)
    states = [MixedSampler(mix, rank=r, world_size=3).state_dict(2) for r in range(3)]
    with pytest.raises(ValueError, match=r"ranks \[2\] is missing"):
        MixedSampler(mix, rank=0, world_size=2).load_state_dict(states[:2])
    other = WeightedMix([range(10), range(5)], [1.0, 1.0], seed=1)
    with pytest.raises(ValueError, match="another order"):
        MixedSampler(other, rank=0, world_size=2).load_state_dict(states)
    with pytest.raises(TypeError, match="elastic state of every rank"):
        MixedSampler(mix, rank=0, world_size=2).load_state_dict({"delivered": 3})
    later = MixedSampler(mix, rank=0, world_size=1)
    later.set_epoch(1)
    with pytest.raises(ValueError, match="different epochs"):
        later.load_state_dict([states[0], later.state_dict(0)])


def test_the_resume_point_is_for_its_epoch_only() -> None:
    mix = WeightedMix([range(12)], seed=4)
    states = [MixedSampler(mix, rank=r, world_size=2).state_dict(3) for r in range(2)]
    sampler = MixedSampler(mix, rank=0, world_size=1)
    sampler.load_state_dict(states)
    assert len(sampler) == 6 and sampler.epoch == 0
    sampler.set_epoch(0)  # Lightning sets the same epoch again: the point holds
    assert len(sampler) == 6
    sampler.set_epoch(1)
    assert len(sampler) == 12


def test_a_cut_epoch_length_is_warned_about() -> None:
    with pytest.warns(UserWarning, match="first source runs out"):
        mix = WeightedMix(
            [range(4), range(10)], [1.0, 1.0], policy="first_exhausted", epoch_length=50
        )
    assert mix.quotas() == [4, 4]
    with pytest.warns(UserWarning, match="all_exhausted"):
        WeightedMix([range(4), range(10)], policy="all_exhausted", epoch_length=50)


def test_bad_arguments_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="weight 1 must be positive"):
        WeightedMix([range(3), range(3)], [1.0, 0.0])
    with pytest.raises(ValueError, match="policy must be one of"):
        WeightedMix([range(3)], policy="round_robin")
    with pytest.raises(ValueError, match="cannot cycle an empty source"):
        WeightedMix([range(3), range(0)], [1.0, 1.0], policy="cycle")
    with pytest.raises(ValueError, match="2 weights for 1"):
        WeightedMix([range(3)], [1.0, 2.0])
