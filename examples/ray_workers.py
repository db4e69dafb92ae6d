"""torch's DataLoader with its workers on a Ray cluster: ``worker_type="ray"``.

    .venv/bin/python examples/ray_workers.py --quick

Why: a GPU node has few cores per GPU, and decoding and augmenting images can need more
than it has. With ``worker_type="ray"`` the loader's ``num_workers`` workers are Ray
actors on other nodes of a Ray cluster, each one of torch's workers (its id, its seed
``base_seed + id``, ``worker_init_fn``, batches in torch's order), so the batches are
the ones torch's own loader makes for the same seed, random augmentations included. The
training loop does not change.

On a real cluster, connect first (``ray.init(address=...)``) or pass
``ray_options={"address": ...}``, and place the actors with Ray's options
(``num_cpus``, ``resources``, ``scheduling_strategy``). Here the example starts its own
cluster on this machine (``torch_spdl.ray_local``): a head and two worker nodes, on
loopback, in a network namespace of its own (it needs root; Ray left alone would bind to
the machine's network address). The actors ask for the worker nodes' ``"remote"``
resource, so none runs in this process or on the head.

It checks its own result: the batches equal torch's local loader's for the same seed, and
no actor of the loader is left once it is done; it exits non-zero if not.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset
from torchvision.transforms import v2

import torch_spdl
from torch_spdl.ray_local import LocalCluster, isolate_network, wait_actors_gone


class NoisyImages(Dataset):
    """Images cropped, flipped and jittered at random in the worker."""

    def __init__(self, n: int) -> None:
        self.images = torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        self.augment = v2.Compose(
            [v2.RandomResizedCrop(32, antialias=True), v2.RandomHorizontalFlip()]
        )

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, float]:
        return self.augment(self.images[i]), i, random.random()


def batches(loader: object) -> list[list[object]]:
    return [[x.tolist() for x in batch] for batch in loader]  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (CI)")
    args = parser.parse_args()
    n = 48 if args.quick else 512
    isolate_network()  # Ray may only see loopback here (see the docstring)
    with LocalCluster(worker_nodes=2, cpus_per_node=1):
        dataset = NoisyImages(n)
        kwargs = dict(batch_size=8, shuffle=True, num_workers=2)
        ours = torch_spdl.DataLoader(
            dataset,
            generator=torch.Generator().manual_seed(1),
            worker_type="ray",
            ray_options={"resources": {"remote": 1}},  # one actor on each worker node
            **kwargs,
        )
        got = batches(ours)
        gen = torch.Generator().manual_seed(1)
        ref = batches(TorchDataLoader(dataset, generator=gen, **kwargs))
        left = wait_actors_gone("torch_spdl-loader-")  # ray.kill lands asynchronously
    print(f"{len(got)} batches from 2 Ray actors on the worker nodes (this is pid {os.getpid()})")
    same = got == ref
    print(f"same batches as torch's loader: {'OK' if same else 'DIFFERENT'}")
    print(f"actors left: {len(left)}")
    return 0 if same and not left else 1


if __name__ == "__main__":
    sys.exit(main())
