"""``DataLoader(worker_type="ray")`` on a real Ray cluster, side by side with torch's loader.

One cluster for the module (a head with no CPU and two worker nodes, on loopback, in a
network namespace of this process's own: ``torch_spdl.ray_local``), so every actor is
"remote": placed by the ``"remote"`` resource on a worker node. The batches are compared
with torch's own DataLoader (local worker processes) for the same seed: random crops and
flips, ``random`` and ``np.random`` drawn in the workers, worker ids, ``worker_init_fn``.
Faults are real: an actor killed with ``ray.kill``, a node stopped mid-epoch. Our actors
are named (``torch_spdl-loader-...``), which is how the tests find and count them.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, get_worker_info

ray = pytest.importorskip("ray")

import _lightning_helpers  # noqa: E402
from _lightning_helpers import IndexData, Recorder  # noqa: E402
from _sync import CHILD_START_S  # noqa: E402

import torch_spdl  # noqa: E402
from torch_spdl.ray_local import (  # noqa: E402
    LocalCluster,
    actors_alive,
    wait_actors_gone,
)

# The datasets below are defined in this module, which Ray's workers cannot import: they
# travel by value, as a script's own classes (defined in __main__) do.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(_lightning_helpers)

REMOTE = {"resources": {"remote": 0.5}, "num_cpus": 0.5}  # two actors fit on one node
PREFIX = "torch_spdl-loader-"


def our_actors() -> list[str]:
    """The names of our loader actors alive in the cluster."""
    return actors_alive(PREFIX)


def no_actor_left() -> bool:
    """Whether every actor of ours is gone (Ray's kill lands asynchronously: waited for)."""
    return wait_actors_gone(PREFIX) == []


# -- datasets ------------------------------------------------------------------------------
class Augmented(Dataset):
    """Images cropped and flipped at random, with ``random`` and NumPy draws."""

    def __init__(self, n: int = 20) -> None:
        self.images = torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(7))
        self.offset = 0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Any:
        from torchvision.transforms import v2

        crop = v2.Compose([v2.RandomResizedCrop(16, antialias=True), v2.RandomHorizontalFlip()])
        info = get_worker_info()
        wid = -1 if info is None else info.id
        return crop(self.images[i]), random.random(), np.random.rand(), wid, i + self.offset


def shift_by_worker(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    info.dataset.offset = 1000 * worker_id
    random.random()  # a draw in worker_init_fn shifts the worker's stream, as under torch


class Sharded(IterableDataset):
    """Each worker yields its share of ``range(n)`` with random draws."""

    def __init__(self, n: int = 22) -> None:
        self.n = n

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield i, torch.rand(2), random.random()


class Indexed(Dataset):
    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == getattr(self, "bad", None):
            raise ValueError(f"sample {i} is broken")
        return i


class Staged(torch_spdl.StagedDataset):
    """A staged dataset whose load (I/O) reports the process it ran in."""

    def __len__(self) -> int:
        return 12

    def load(self, i: int) -> tuple[int, int]:
        return i, os.getpid()

    def process(self, raw: tuple[int, int]) -> tuple[torch.Tensor, int]:
        i, pid = raw
        return torch.rand(2) + i, pid


def flatten(batches: list[Any]) -> list[Any]:
    return [torch_spdl_tree(b) for b in batches]


def torch_spdl_tree(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, (list, tuple)):
        return [torch_spdl_tree(x) for x in batch]
    return batch


def two_epochs(loader: Any) -> list[Any]:
    return flatten([b for b in loader] + [b for b in loader])


# -- torch's batches -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,workers,persistent",
    [("map", 2, False), ("map", 3, True), ("iterable", 2, True), ("iterable", 3, False)],
)
def test_batches_are_torchs(cluster: LocalCluster, kind: str, workers: int, persistent: bool):
    def make(cls: Any, **extra: Any) -> Any:
        common: dict[str, Any] = dict(
            batch_size=3, num_workers=workers, persistent_workers=persistent
        )
        if kind == "map":
            dataset: Any = Augmented()
            common.update(shuffle=True, worker_init_fn=shift_by_worker)
        else:
            dataset = Sharded()
        return cls(dataset, generator=torch.Generator().manual_seed(5), **common, **extra)

    ref = two_epochs(make(TorchDataLoader))
    ours = two_epochs(make(torch_spdl.DataLoader, worker_type="ray", ray_options=REMOTE))
    assert ours == ref
    assert no_actor_left()


def test_a_staged_datasets_stages_run_in_the_actors(cluster: LocalCluster):
    gen = torch.Generator().manual_seed(3)
    loader = torch_spdl.DataLoader(
        Staged(), batch_size=4, num_workers=2, generator=gen, worker_type="ray",
        ray_options=REMOTE,
    )
    batches = list(loader)
    pids = {int(p) for b in batches for p in b[1]}
    assert os.getpid() not in pids and len(pids) == 2
    ref = list(TorchDataLoader(Staged(), batch_size=4, num_workers=2,
                               generator=torch.Generator().manual_seed(3)))
    assert [b[0].tolist() for b in batches] == [b[0].tolist() for b in ref]


# -- resume --------------------------------------------------------------------------------
@pytest.mark.parametrize("taken", [0, 1, 5, 10])
def test_resume_delivers_exactly_the_rest(cluster: LocalCluster, taken: int):
    def loader() -> Any:
        return torch_spdl.DataLoader(
            Indexed(), batch_size=4, shuffle=True, num_workers=2, worker_type="ray",
            ray_options=REMOTE, generator=torch.Generator().manual_seed(11),
        )

    whole = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it).tolist() for _ in range(taken)]
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    rest = [b.tolist() for b in second]
    if taken == len(whole):  # a state taken at the end: the next epoch is a fresh one
        assert len(rest) == len(whole)
    else:
        assert head + rest == whole
    assert no_actor_left()


# -- faults --------------------------------------------------------------------------------
def kill_one_actor(slot: int) -> None:
    name = next(n for n in our_actors() if f"-w{slot}-" in n)
    ray.kill(ray.get_actor(name, namespace=_namespace_of(name)), no_restart=True)


def _namespace_of(name: str) -> str:
    return next(
        a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"] == name
    )


def test_a_killed_actor_is_replaced_and_the_epoch_is_torchs(cluster: LocalCluster):
    def make(cls: Any, **extra: Any) -> Any:
        return cls(Augmented(24), batch_size=2, shuffle=True, num_workers=2,
                   generator=torch.Generator().manual_seed(9), **extra)

    ref = flatten(list(make(TorchDataLoader)))
    loader = make(torch_spdl.DataLoader, worker_type="ray", ray_options=REMOTE)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    kill_one_actor(0)
    got += list(it)
    assert flatten(got) == ref  # every batch once, in order, bit-identical
    assert no_actor_left()


def test_a_lost_node_loses_no_batch(cluster: LocalCluster):
    spare = cluster.add_node(1)  # room for the replacements
    try:
        def make(cls: Any, **extra: Any) -> Any:
            return cls(Augmented(24), batch_size=2, shuffle=True, num_workers=2,
                       generator=torch.Generator().manual_seed(4), **extra)

        ref = flatten(list(make(TorchDataLoader)))
        # one actor a node: the node removed holds one of them
        one_each = {"resources": {"remote": 1}, "num_cpus": 1}
        loader = make(torch_spdl.DataLoader, worker_type="ray", ray_options=one_each)
        it = iter(loader)
        got = [next(it) for _ in range(2)]
        cluster.remove_node(cluster.nodes[0])
        got += list(it)
        assert flatten(got) == ref
        del it
        assert no_actor_left()
    finally:
        assert spare in cluster.nodes  # it stays: the later tests have two worker nodes


def test_the_replacement_budget_is_bounded(cluster: LocalCluster):
    options = {**REMOTE, "max_replacements": 0}
    loader = torch_spdl.DataLoader(
        Indexed(), batch_size=2, num_workers=2, worker_type="ray", ray_options=options
    )
    it = iter(loader)
    next(it)
    kill_one_actor(0)
    with pytest.raises(RuntimeError, match="budget of 0 replacements"):
        list(it)
    del it
    assert no_actor_left()


class Pair(NamedTuple):
    """A batch type of the script's own (it reaches the actors by value)."""

    x: Any
    i: Any


class PairData(Indexed):
    def __getitem__(self, i: int) -> Pair:
        return Pair(torch.full((2,), float(i)), i)


def test_a_batch_of_a_class_defined_in_the_script_comes_back(cluster: LocalCluster):
    loader = torch_spdl.DataLoader(
        PairData(8), batch_size=4, num_workers=2, worker_type="ray", ray_options=REMOTE
    )
    batches = list(loader)
    assert [type(b).__name__ for b in batches] == ["Pair", "Pair"]
    assert [b.i.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert no_actor_left()


def test_a_persistent_iterable_worker_killed_in_its_second_epoch_is_torchs(
    cluster: LocalCluster,
):
    def make(cls: Any, **extra: Any) -> Any:
        return cls(Sharded(24), batch_size=2, num_workers=2, persistent_workers=True,
                   generator=torch.Generator().manual_seed(8), **extra)

    ref = two_epochs(make(TorchDataLoader))
    loader = make(torch_spdl.DataLoader, worker_type="ray", ray_options=REMOTE)
    got = flatten(list(loader))
    it = iter(loader)
    second = [next(it) for _ in range(3)]
    kill_one_actor(0)
    got += flatten(second + list(it))
    assert got == ref
    del it, loader
    assert no_actor_left()


@pytest.mark.parametrize("option", ["max_concurrency", "lifetime", "namespace"])
def test_options_that_would_break_the_contract_are_refused(cluster: LocalCluster, option: str):
    value = {"max_concurrency": 4, "lifetime": "detached", "namespace": "x"}[option]
    loader = torch_spdl.DataLoader(
        Indexed(), num_workers=2, worker_type="ray", ray_options={**REMOTE, option: value}
    )
    with pytest.raises(ValueError, match=option):
        iter(loader)
    assert no_actor_left()


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_users_exception_names_the_sample_the_worker_and_the_remote_traceback(
    cluster: LocalCluster,
):
    dataset = Indexed()
    dataset.bad = 5
    loader = torch_spdl.DataLoader(
        dataset, batch_size=2, num_workers=2, worker_type="ray", ray_options=REMOTE
    )
    with pytest.raises(ValueError, match="sample 5 is broken") as caught:
        list(loader)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "sample index 5" in notes
    assert "Ray actor of worker 0" in notes  # batch 2 (samples 4, 5) is worker 0's
    assert "in __getitem__" in notes and "raise ValueError" in notes  # its traceback
    assert no_actor_left()


class Locked(Indexed):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


@pytest.mark.timeout(60)
def test_an_unpicklable_dataset_is_refused_at_once(cluster: LocalCluster):
    loader = torch_spdl.DataLoader(Locked(), num_workers=2, worker_type="ray")
    with pytest.raises(TypeError, match="must pickle"):
        iter(loader)
    assert no_actor_left()


@pytest.mark.timeout(60)
def test_resources_no_node_has_are_named(cluster: LocalCluster):
    options = {"resources": {"tpu_v9": 1}}
    loader = torch_spdl.DataLoader(Indexed(), num_workers=2, worker_type="ray",
                                   ray_options=options)
    with pytest.raises(ValueError, match="tpu_v9"):
        iter(loader)
    assert no_actor_left()


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_START_S
    )


@pytest.mark.timeout(CHILD_START_S)
def test_an_unreachable_cluster_is_named(cluster: LocalCluster):
    code = (
        "import torch_spdl\n"
        "dl = torch_spdl.DataLoader(list(range(4)), num_workers=1, worker_type='ray',\n"
        "    ray_options={'address': '127.0.0.1:9'})\n"
        "try:\n    iter(dl)\nexcept ConnectionError as e:\n    print('ERR', e)\n"
    )
    done = _child(code)
    assert "ERR" in done.stdout and "127.0.0.1:9" in done.stdout, done.stderr[-2000:]


@pytest.mark.timeout(CHILD_START_S)
def test_without_ray_the_error_says_how_to_install_it():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import torch_spdl\n"
        "dl = torch_spdl.DataLoader(list(range(4)), num_workers=1, worker_type='ray')\n"
        "try:\n    iter(dl)\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    done = _child(code)
    assert "ERR" in done.stdout and "pip install" in done.stdout, done.stderr[-2000:]


# -- stopping ------------------------------------------------------------------------------
def test_break_and_del_stop_the_actors(cluster: LocalCluster):
    loader = torch_spdl.DataLoader(
        Indexed(), batch_size=2, num_workers=2, worker_type="ray", ray_options=REMOTE
    )
    for _ in loader:
        break
    assert no_actor_left()
    persistent = torch_spdl.DataLoader(
        Indexed(), batch_size=2, num_workers=2, worker_type="ray", ray_options=REMOTE,
        persistent_workers=True,
    )
    assert len(list(persistent)) == 20
    assert len(our_actors()) == 2  # kept across epochs
    assert len(list(persistent)) == 20
    del persistent
    assert no_actor_left()


class Interrupting(Indexed):
    """Sample 3 sends Ctrl-C to the training process, then never returns (a stuck worker)."""

    def __init__(self, trainer: int) -> None:
        super().__init__()
        self.trainer = trainer

    def __getitem__(self, i: int) -> int:
        if i == 3:
            import signal
            import time

            os.kill(self.trainer, signal.SIGINT)
            time.sleep(3600)  # stuck: stopping must not wait for it
        return i


@pytest.mark.timeout(120)
def test_ctrl_c_stops_the_actors_without_waiting_for_a_stuck_one(cluster: LocalCluster):
    loader = torch_spdl.DataLoader(
        Interrupting(os.getpid()), batch_size=2, num_workers=2, worker_type="ray",
        ray_options=REMOTE,
    )
    with pytest.raises(KeyboardInterrupt):
        list(loader)
    assert no_actor_left()


# -- distributed training --------------------------------------------------------------------
def references_held() -> int:
    """How many object references this process holds, from Ray's own table (its state API
    would show the cluster's objects, but it needs the dashboard, off here). Every object
    the loader makes (the dataset put once, each batch an actor returns) is owned by this
    process, so none left here is none left in the cluster."""
    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


def test_no_object_outlives_the_loader(cluster: LocalCluster):
    before = references_held()
    loader = torch_spdl.DataLoader(
        Augmented(), batch_size=4, num_workers=2, worker_type="ray", ray_options=REMOTE,
        persistent_workers=True,
    )
    kept = list(loader)  # an epoch whose batches are kept (views of the objects)
    for _ in loader:  # and one broken off with batches in flight
        break
    assert references_held() > before  # the dataset, while the loader lives
    del loader, kept
    gc.collect()
    assert references_held() == before
    assert no_actor_left()


def test_each_rank_reads_its_share_once(cluster: LocalCluster):
    dataset = Indexed(30)
    seen: list[int] = []
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=1)
        sampler.set_epoch(3)
        loader = torch_spdl.DataLoader(
            dataset, batch_size=4, sampler=sampler, num_workers=2, worker_type="ray",
            ray_options=REMOTE,
        )
        seen += [i for b in loader for i in b.tolist()]
    assert sorted(seen) == list(range(30))
    assert no_actor_left()


def test_a_lightning_datamodule_takes_ray_workers(cluster: LocalCluster):
    from torch_spdl.lightning import StagedDataModule

    module = StagedDataModule(
        train=Indexed(16), batch_size=4, cpu_concurrency=2, worker_type="ray",
        ray_options=REMOTE, shuffle=False,
    )
    module.setup("fit")
    batches = [b.tolist() for b in module.train_dataloader()]
    assert sorted(i for b in batches for i in b) == list(range(16))
    assert no_actor_left()


class SwappedDataModule(pl.LightningDataModule):
    """A plain DataModule whose only change is the loader: ours, on Ray workers."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__()
        self.loader = loader or (lambda **kw: torch_spdl.DataLoader(
            **kw, num_workers=2, worker_type="ray", ray_options=REMOTE
        ))

    def train_dataloader(self) -> Any:
        return self.loader(dataset=IndexData(24), batch_size=4, shuffle=True)


def fit(module: pl.LightningDataModule) -> dict[int, list[int]]:
    pl.seed_everything(5)
    model = Recorder()
    pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, logger=False,
    ).fit(model, module)
    return model.seen["train"]


def test_trainer_fit_with_a_swapped_datamodule_on_ray_workers_sees_torchs_order(
    cluster: LocalCluster,
):
    ours = fit(SwappedDataModule())
    torchs = fit(SwappedDataModule(TorchDataLoader))
    assert ours == torchs and ours[0] != ours[1]
    assert sorted(ours[0]) == sorted(ours[1]) == list(range(24))
    assert no_actor_left()


def test_the_cluster_listens_on_loopback_only(cluster: LocalCluster):
    listening = subprocess.run(["ss", "-tlnH"], capture_output=True, text=True).stdout
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()}
    assert addresses and addresses <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, addresses
