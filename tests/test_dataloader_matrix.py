"""``torch_spdl.DataLoader`` against ``torch.utils.data.DataLoader``: the matrix.

Every sampler, batching and collate configuration, every sample kind, map-style and
iterable datasets, with 0, 2 and 4 workers: torch's own loader with ``num_workers=0`` is
the reference and ours must give the same batches, in order.

Why not the whole product of the three: it is 264 cases, most of them starting worker
processes for both loaders, and on a slow machine it took 33 minutes of the suite. The
cases are a covering design instead: every configuration with every sample kind, every
configuration with every worker count, and every sample kind with every worker count, in
88 cases. The three only meet pairwise in the code: the configuration decides the indices
and batches, the worker count which process makes a batch, the sample kind how it is
collated and carried back. ``TORCH_SPDL_FULL_MATRIX=1`` runs the whole product.

Synchronisation is done with barriers, events and conditions (with timeouts so a bug fails
rather than hangs), never with sleeps.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
from _dl_helpers import (
    IterData,
    MapData,
    N,
    VarBatchSampler,
    assert_same_batches,
    gen,
    ids,
    list_collate,
    make_sample,
    single_collate,
)
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
)
from torch.utils.data import DataLoader as TorchDataLoader

from torch_spdl import DataLoader

# -- 1. the matrix against torch ---------------------------------------------------------------
MAP_CONFIGS = {
    "default": lambda ds: {},
    "bs4": lambda ds: {"batch_size": 4},
    "bs4_drop_last": lambda ds: {"batch_size": 4, "drop_last": True},
    "shuffle": lambda ds: {"batch_size": 3, "shuffle": True, "generator": gen(7)},
    "shuffle_drop_last": lambda ds: {
        "batch_size": 5,
        "shuffle": True,
        "drop_last": True,
        "generator": gen(8),
    },
    "subset_sampler": lambda ds: {
        "batch_size": 3,
        "sampler": SubsetRandomSampler(list(range(1, len(ds), 2)), generator=gen(3)),
    },
    "list_sampler_repeats": lambda ds: {"batch_size": 2, "sampler": [5, 3, 3, 0, 22, 5, 1]},
    "weighted_sampler": lambda ds: {
        "batch_size": 4,
        "sampler": WeightedRandomSampler(
            [float(i % 3 + 1) for i in range(len(ds))], 30, replacement=True, generator=gen(5)
        ),
    },
    "var_batch_sampler": lambda ds: {"batch_sampler": VarBatchSampler(len(ds), seed=11)},
    "batch_sampler": lambda ds: {
        "batch_sampler": BatchSampler(RandomSampler(ds, generator=gen(2)), 4, drop_last=True)
    },
    "batch_none": lambda ds: {"batch_size": None},
    "batch_none_shuffle": lambda ds: {"batch_size": None, "shuffle": True, "generator": gen(9)},
    "collate_fn": lambda ds: {"batch_size": 4, "collate_fn": list_collate},
    "collate_fn_lambda": lambda ds: {"batch_size": 3, "collate_fn": lambda b: ("n", len(b), b)},
    "collate_fn_none": lambda ds: {"batch_size": None, "collate_fn": single_collate},
    "prefetch_persistent": lambda ds: {
        "batch_size": 4,
        "shuffle": True,
        "generator": gen(4),
        "prefetch_factor": 3,
        "persistent_workers": True,
    },
}

ITER_CONFIGS = {
    "default": lambda ds: {},
    "bs4": lambda ds: {"batch_size": 4},
    "bs4_drop_last": lambda ds: {"batch_size": 4, "drop_last": True},
    "batch_none": lambda ds: {"batch_size": None},
    "collate_fn": lambda ds: {"batch_size": 3, "collate_fn": list_collate},
    "collate_fn_none": lambda ds: {"batch_size": None, "collate_fn": single_collate},
}

KINDS = ["tensor", "dict", "tuple", "int"]
WORKERS = [0, 2, 4]
NEEDS_WORKERS = {"prefetch_persistent"}  # torch rejects these knobs with num_workers=0


def covering(configs: list[str]) -> list[tuple[str, str, int]]:
    """(config, kind, workers) cases: each config with each kind once, the worker count
    turning with both indices, so that every pair of the three appears (a config that needs
    workers turns over the counts above 0). With ``TORCH_SPDL_FULL_MATRIX=1``: the product."""
    full = os.environ.get("TORCH_SPDL_FULL_MATRIX") == "1"
    cases = []
    for i, config in enumerate(configs):
        counts = [w for w in WORKERS if w] if config in NEEDS_WORKERS else WORKERS
        for j, kind in enumerate(KINDS):
            chosen = counts if full else [counts[(i + j) % len(counts)]]
            cases += [(config, kind, w) for w in chosen]
    return cases


def run_both(ds: Dataset, config, num_workers: int, **ours_kwargs: Any):
    """(our batches, torch's batches, our len, torch's len) for one configuration: torch's
    single-process loader for a map-style dataset (same batches, and fast); for an
    iterable one, torch's worker processes (each worker reads its own copy)."""
    ref_kwargs = config(ds)
    workers = num_workers if isinstance(ds, IterableDataset) else 0
    if not workers:
        ref_kwargs.pop("prefetch_factor", None)
        ref_kwargs.pop("persistent_workers", None)
    ref = TorchDataLoader(ds, num_workers=workers, **ref_kwargs)
    ours = DataLoader(ds, num_workers=num_workers, **config(ds), **ours_kwargs)
    return list(ours), list(ref), len(ours), len(ref)


@pytest.mark.parametrize(("config", "kind", "num_workers"), covering(list(MAP_CONFIGS)))
def test_map_style_matches_torch(config: str, kind: str, num_workers: int) -> None:
    ds = MapData(N, kind)
    ours, ref, n_ours, n_ref = run_both(ds, MAP_CONFIGS[config], num_workers)
    assert_same_batches(ours, ref)
    assert n_ours == n_ref == len(ref)


@pytest.mark.parametrize(("config", "kind", "num_workers"), covering(list(ITER_CONFIGS)))
def test_iterable_matches_torch(config: str, kind: str, num_workers: int) -> None:
    ds = IterData(N, kind)
    ours, ref, n_ours, n_ref = run_both(ds, ITER_CONFIGS[config], num_workers)
    assert_same_batches(ours, ref)
    assert n_ours == n_ref  # len(dataset) batches, as torch says (each worker reads it all)


def test_iterable_without_len_matches_torch() -> None:
    class NoLen(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    ours = DataLoader(NoLen(), batch_size=3, num_workers=2)
    ref = TorchDataLoader(NoLen(), batch_size=3, num_workers=2)
    assert_same_batches(list(ours), list(ref))
    with pytest.raises(TypeError):
        len(ref)
    with pytest.raises(TypeError):
        len(ours)


def test_iterable_sharding_by_worker_info_reads_everything_once() -> None:
    """An IterableDataset that shards itself by torch's worker info (the usual recipe)
    reads every sample once, in torch's order, whatever the number of workers."""
    from _dl_helpers import ShardedByWorker

    for workers in (0, 1, 3):
        ref = list(TorchDataLoader(ShardedByWorker(12), batch_size=4, num_workers=workers))
        ours = list(DataLoader(ShardedByWorker(12), batch_size=4, num_workers=workers))
        assert_same_batches(ours, ref)
        assert sorted(i for b in ours for i in b.tolist()) == list(range(12))


@pytest.mark.parametrize("num_workers", [0, 4])
def test_out_of_order_gives_the_same_samples(num_workers: int) -> None:
    ds = MapData(40, "int")
    ref = TorchDataLoader(ds, batch_size=3, shuffle=True, generator=gen(1))
    ours = DataLoader(
        ds, batch_size=3, shuffle=True, generator=gen(1), num_workers=num_workers, in_order=False
    )
    got = ids(list(ours))
    want = ids(list(ref))
    assert sorted(map(sorted, got)) == sorted(map(sorted, want))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device": "cpu"},
        {"pin_memory": True},
        {"collate_concurrency": 3},
        {"buffer_size": 1},
        {"io_concurrency": 2, "cpu_concurrency": 3},
    ],
    ids=lambda kw: ",".join(kw),
)
def test_extra_knobs_keep_torch_output(kwargs: dict[str, Any]) -> None:
    ds = MapData(N, "dict")
    config = MAP_CONFIGS["shuffle"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about pin_memory without a GPU
        ours, ref, _, _ = run_both(ds, config, 3, **kwargs)
    assert_same_batches(ours, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pin_memory", [False, True])
def test_device_moves_batches_to_cuda(pin_memory: bool) -> None:
    ds = MapData(N, "dict")
    ref = list(TorchDataLoader(ds, batch_size=4))
    ours = list(DataLoader(ds, batch_size=4, num_workers=2, device="cuda", pin_memory=pin_memory))
    assert ours[0]["x"].device.type == "cuda"
    moved_back = [
        {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in ours
    ]
    assert_same_batches(moved_back, ref)


@pytest.mark.parametrize(
    "configs", [list(MAP_CONFIGS), list(ITER_CONFIGS)], ids=["map", "iterable"]
)
def test_the_covering_design_meets_every_pair(configs: list[str]) -> None:
    """Guards the design itself: every two of config, kind and worker count meet."""
    cases = covering(configs)
    assert {(c, k) for c, k, _ in cases} == {(c, k) for c in configs for k in KINDS}
    for c in configs:
        allowed = {w for w in WORKERS if w or c not in NEEDS_WORKERS}
        assert {w for c2, _, w in cases if c2 == c} == allowed
    assert {(k, w) for _, k, w in cases} == {(k, w) for k in KINDS for w in WORKERS}


def test_default_collate_of_sample_kinds_sanity() -> None:
    """The matrix's sample kinds collate as expected (guards the reference itself)."""
    batch = default_collate([make_sample(i, "dict") for i in range(3)])
    assert batch["name"] == ["s0", "s1", "s2"]
    assert torch.equal(batch["y"], torch.tensor([0, 1, 2]))
