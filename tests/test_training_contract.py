"""The contract a training script relies on, side by side with torch's DataLoader.

With only the import swapped and default arguments, a script must get the same batches
as with torch's loader, run after run, random augmentations included; its own RNG draws,
allocator settings and intra-op threads must be left as torch's loader leaves them; and a
worker that crashes is an exception in the loop, after which the next epoch runs
(docs/dataloader.md, "The contract").
"""

from __future__ import annotations

import hashlib
import inspect
import os
import random
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset
from torchvision.datasets import FakeData

import torch_spdl
from torch_spdl.data import WorkerFailure


class Augmented(Dataset):
    """Small images through torchvision's random transforms, plus a NumPy, a ``random``
    and a torch draw per sample: every global RNG a training script's dataset uses."""

    def __init__(self, n: int = 48) -> None:
        self.transform = T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip()])
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 24, 24), dtype=torch.uint8, generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, float, float, torch.Tensor]:
        return self.transform(self.images[i]), np.random.rand(), random.random(), torch.rand(())


def _digest(batch: object) -> str:
    flat = torch.utils._pytree.tree_leaves(batch)
    h = hashlib.sha1()
    for leaf in flat:
        h.update(torch.as_tensor(leaf).numpy().tobytes())
    return h.hexdigest()


def _epochs(loader_cls: type, dataset: Dataset, epochs: int, seed: int, **kwargs: object):
    """Each batch's digest over ``epochs`` epochs, and the training thread's own draws
    (one ``torch.randn`` after every batch), from a script seeded with ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    loader = loader_cls(dataset, **kwargs)
    batches, draws = [], []
    for _ in range(epochs):
        for batch in loader:
            batches.append(_digest(batch))
            draws.append(torch.randn(2))
    return batches, torch.stack(draws), random.random(), np.random.rand()


def test_random_augmentations_give_torchs_batches_run_after_run() -> None:
    kwargs = {"batch_size": 8, "shuffle": True, "num_workers": 2}
    ours1 = _epochs(torch_spdl.DataLoader, Augmented(), 3, 0, **kwargs)
    ours2 = _epochs(torch_spdl.DataLoader, Augmented(), 3, 0, **kwargs)
    theirs = _epochs(TorchDataLoader, Augmented(), 3, 0, **kwargs)
    assert len(theirs[0]) == 18
    assert ours1[0] == theirs[0]
    assert ours2[0] == theirs[0]
    assert torch.equal(ours1[1], theirs[1])
    assert ours1[2:] == theirs[2:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_training_threads_draws_are_torchs(num_workers: int) -> None:
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": num_workers}
    ours = _epochs(torch_spdl.DataLoader, Augmented(16), 2, 7, **kwargs)
    theirs = _epochs(TorchDataLoader, Augmented(16), 2, 7, **kwargs)
    assert ours[0] == theirs[0]
    assert torch.equal(ours[1], theirs[1])
    assert ours[2:] == theirs[2:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fakedata_samples_are_exactly_ds_i(num_workers: int) -> None:
    # FakeData sets and restores the global RNG inside __getitem__: a sample is right only
    # if no other draw happens in that process while it runs.
    ds = FakeData(2000, image_size=(3, 4, 4), num_classes=10, transform=T.PILToTensor())
    loader = torch_spdl.DataLoader(ds, batch_size=50, num_workers=num_workers)
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
        torch.randn(3)  # the training step draws meanwhile
    expected = [ds[i] for i in range(len(ds))]
    assert torch.equal(torch.cat(images), torch.stack([x for x, _ in expected]))
    assert torch.cat(labels).tolist() == [int(y) for _, y in expected]


_PROCESS_STATE = textwrap.dedent(
    """
    import ctypes, json, os, sys
    import torch

    code = torch.utils.data.get_worker_info.__code__  # before torch_spdl is imported
    import torch_spdl

    libc = ctypes.CDLL(None)

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped_when_freed_big_block_before():
        # glibc raises its mmap threshold when a mapped block is freed, unless a program
        # fixed it with mallopt: then a block after a freed one twice its size is mapped.
        # The block is larger than all the free memory of the heap, so that only a mapping
        # or a grown heap can serve it.
        size = max(2 << 20, libc.mallinfo2().fordblks + (1 << 20))
        libc.free(libc.malloc(2 * size))
        before = libc.mallinfo2().hblks
        p = libc.malloc(size)
        mapped = libc.mallinfo2().hblks - before
        libc.free(p)
        return mapped

    class Squares(torch.utils.data.Dataset):
        def __len__(self): return 64
        def __getitem__(self, i): return torch.full((64, 64), float(i))

    threads = torch.get_num_threads()
    nice = os.nice(0)
    before = mapped_when_freed_big_block_before()
    loader = torch_spdl.DataLoader(Squares(), batch_size=8, num_workers=int(sys.argv[1]))
    total = sum(float(b.sum()) for b in loader)
    print(json.dumps({
        "threads": [threads, torch.get_num_threads()],
        "nice": [nice, os.nice(0)],
        "mapped": [before, mapped_when_freed_big_block_before()],
        "total": total,
        "torch_functions_untouched": torch.utils.data.get_worker_info.__code__ is code,
        # the engine beyond its contracts (errors, protocols, stats): no pipeline ran
        "engine_loaded": sorted(
            m for m in sys.modules
            if m.startswith("torch_spdl.pipeline.")
            and not m.startswith("torch_spdl.pipeline._core")
        ),
    }))
    """
)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_training_process_is_left_alone(num_workers: int) -> None:
    import json

    out = subprocess.run(
        [sys.executable, "-c", _PROCESS_STATE, str(num_workers)],
        capture_output=True,
        text=True,
        check=True,
    )
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state["total"] == sum(i * 64 * 64 for i in range(64))
    assert state["threads"][0] == state["threads"][1]
    assert state["nice"][0] == state["nice"][1]
    assert state["mapped"] == [0, 0]
    assert state["torch_functions_untouched"]
    # torch's default shape (next() feeds the workers) declares no pipeline, so a script
    # that swaps its import carries none of the engine (docs/dataloader.md, "Memory")
    assert state["engine_loaded"] == []


class Niceness(Dataset):
    """Each sample is the niceness of the process that loads it: after ``compute`` seconds
    of the thread's CPU time, or ``wait`` seconds waiting (as on a read)."""

    def __init__(self, compute: float = 0.0, wait: float = 0.0) -> None:
        self.compute, self.wait = compute, wait

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        until = time.thread_time() + self.compute
        while time.thread_time() < until:
            pass
        time.sleep(self.wait)  # the workload (a read), not a synchronisation
        return os.nice(0)


def _niceness_by_batch(dataset: Dataset, **kwargs: Any) -> list[set[int]]:
    # one worker, so its batches come in the order it loaded them
    loader = torch_spdl.DataLoader(dataset, batch_size=2, num_workers=1, **kwargs)
    return [set(batch.tolist()) for batch in loader]


@pytest.mark.parametrize("worker_nice", [None, 0, 3])
def test_a_computing_worker_yields_the_cores_to_the_training_loop(
    worker_nice: int | None,
) -> None:
    own = os.nice(0)
    kwargs = {} if worker_nice is None else {"worker_nice": worker_nice}
    seen = _niceness_by_batch(Niceness(compute=0.002), **kwargs)
    raised = min(own + (10 if worker_nice is None else worker_nice), 19)
    # its first batch shows it computes: every later one is loaded at the raised niceness
    assert seen == [{own}] + [{raised}] * 7
    assert os.nice(0) == own  # the training process keeps its own


def test_a_waiting_worker_keeps_its_niceness() -> None:
    """A worker whose samples are waits (I/O) would only queue behind the training
    threads each time a wait ends: it keeps the loader's niceness."""
    own = os.nice(0)
    assert _niceness_by_batch(Niceness(wait=0.02)) == [{own}] * 8


class StagedNiceness(torch_spdl.StagedDataset):
    """A staged dataset whose ``load`` (run on the worker's load threads) waits ``wait``
    seconds, as a read does, then computes ``compute`` seconds of the thread's CPU time,
    as a decode does; each sample is the niceness of the load thread and of the thread
    that runs ``process``."""

    def __init__(self, compute: float, wait: float) -> None:
        self.compute, self.wait = compute, wait

    def __len__(self) -> int:
        return 32

    def load(self, index: int) -> int:
        time.sleep(self.wait)  # the workload (a read), not a synchronisation
        until = time.thread_time() + self.compute
        while time.thread_time() < until:
            pass
        return os.nice(0)

    def process(self, loaded: int) -> tuple[int, int]:
        return loaded, os.nice(0)


def _staged_niceness_by_batch(dataset: Dataset) -> list[set[int]]:
    loader = torch_spdl.DataLoader(dataset, batch_size=4, num_workers=1, io_concurrency=4)
    return [set(torch.stack(batch).flatten().tolist()) for batch in loader]


def test_a_worker_whose_load_threads_compute_yields_the_cores() -> None:
    """A staged dataset's decode in ``load`` runs on the worker's load threads while its
    main thread waits for them: the worker computes all the same, and every one of its
    threads (the load threads too) takes the raised niceness."""
    own = os.nice(0)
    seen = _staged_niceness_by_batch(StagedNiceness(compute=0.005, wait=0.01))
    assert seen == [{own}] + [{min(own + 10, 19)}] * 7
    assert os.nice(0) == own


def test_a_worker_whose_load_threads_wait_keeps_its_niceness() -> None:
    own = os.nice(0)
    assert _staged_niceness_by_batch(StagedNiceness(compute=0.0, wait=0.02)) == [{own}] * 8


class StackDepth(Dataset):
    """Each sample is how many frames are under ``__getitem__`` in the process loading it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return len(inspect.stack(0))


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_a_workers_stack_is_no_deeper_than_torchs(persistent_workers: bool) -> None:
    """Code that walks the stack for every sample (``torch.manual_seed``, which FakeData
    calls, formats it three times) pays for every frame its worker inherited from the
    fork: ours fork no deeper than torch's, from the same loop."""

    def depths(loader_class: type) -> set[int]:
        loader = loader_class(
            StackDepth(), batch_size=4, num_workers=2, persistent_workers=persistent_workers
        )
        return {int(d) for batch in loader for d in batch}

    (theirs,), (ours,) = depths(TorchDataLoader), depths(torch_spdl.DataLoader)
    assert ours <= theirs


class Segfaults(Dataset):
    """Sample ``crash_at`` crashes its worker process in C while ``crash_at`` is set."""

    crash_at: int | None = 5

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> int:
        if i == self.crash_at:
            import ctypes

            ctypes.string_at(0)  # a read of address 0: SIGSEGV
        return i


def test_a_segfault_in_getitem_is_an_exception_in_the_loop_and_the_next_epoch_runs() -> None:
    ds = Segfaults()
    loader = torch_spdl.DataLoader(ds, batch_size=2, num_workers=2)
    seen = []
    # torch's wording (scripts and torch's own tests match it), and the signal's name
    with pytest.raises(
        WorkerFailure, match=r"DataLoader worker \(pid \d+\) is killed by signal: .*SIGSEGV"
    ):
        for batch in loader:
            seen.extend(batch.tolist())
    assert 4 not in seen and 5 not in seen
    ds.crash_at = None
    assert [i for b in loader for i in b.tolist()] == list(range(16))


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch_size=st.integers(1, 7),
    num_workers=st.integers(0, 3),
    drop_last=st.booleans(),
)
def test_batches_equal_torchs_for_any_seed_and_shape(
    seed: int, batch_size: int, num_workers: int, drop_last: bool
) -> None:
    kwargs = {
        "batch_size": batch_size,
        "shuffle": True,
        "num_workers": num_workers,
        "drop_last": drop_last,
    }
    ours = _epochs(torch_spdl.DataLoader, Augmented(20), 2, seed, **kwargs)
    theirs = _epochs(TorchDataLoader, Augmented(20), 2, seed, **kwargs)
    assert ours[0] == theirs[0]
    assert torch.equal(ours[1], theirs[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pinned_and_device_batches_with_the_default_workers(num_workers: int) -> None:
    def seeded_batches(loader_cls: type, **kwargs: object) -> list:
        torch.manual_seed(3)
        random.seed(3)
        np.random.seed(3)
        return list(loader_cls(Augmented(16), batch_size=4, num_workers=num_workers, **kwargs))

    expected = [_digest(b) for b in seeded_batches(TorchDataLoader, pin_memory=True)]
    batches = seeded_batches(torch_spdl.DataLoader, pin_memory=True)
    assert all(b[0].is_pinned() for b in batches)
    assert [_digest(b) for b in batches] == expected  # torch's batches, pinned
    on_gpu = torch_spdl.DataLoader(
        Augmented(16), batch_size=4, num_workers=num_workers, device="cuda"
    )
    for batch in on_gpu:
        assert batch[0].device.type == "cuda"
        assert batch[0].dtype == torch.uint8 and batch[0].shape == (4, 3, 12, 12)
