"""What a benchmark's training loop does with each batch: the consumers every loader is
judged with (a data loader is judged inside a training script).

- ``touch``: reads one element of every 4 KiB page of each tensor of the batch, as a
  training step reads all of it, and nothing else (the loader alone);
- ``train``: a small CNN's forward, backward and SGD step per batch on a 32x3x64x64 input
  (the batch's own when it holds such an image batch), at torch's default intra-op
  threads: the training loop needs the cores, the GIL and the allocator too;
- ``gpu``: what a GPU step costs the host: 2 ms of Python holding the GIL (the kernel
  launches), then 8 ms waiting without it (the synchronisation);
- ``count``: nothing (only the samples are counted): not a training loop, kept to compare
  with figures measured so.

A batch is a tensor, a list or tuple of parts (``[inputs, labels]``), or a dict of them
(a WebDataset-style sample batch); the image input is its first 4-D 3-channel tensor.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["CONSUMERS", "TrainStep", "consumer_of", "gpu_step", "touch", "touch_all"]

CONSUMERS = ("touch", "train", "gpu")  # what the swap benchmark runs ("count" is extra)


def touch(batch: Any) -> None:
    """Read one element of every 4 KiB page of a tensor batch, as any real consumer (a copy
    to the GPU, a normalisation) reads all of it: a page that was mapped but never read is
    not delivered data, and reading it costs a page fault in the consumer for torch's
    shared-memory batches too."""
    if isinstance(batch, torch.Tensor) and batch.numel() * batch.element_size() >= 4096:
        step = max(4096 // batch.element_size(), 1)
        int(batch.reshape(-1)[::step].sum())


def _parts(batch: Any) -> list[Any]:
    if isinstance(batch, Mapping):
        return list(batch.values())
    if isinstance(batch, (list, tuple)):
        return list(batch)
    return [batch]


def touch_all(batch: Any) -> None:
    for part in _parts(batch):
        touch(part)


class TrainStep:
    """A small CNN's forward, backward and SGD step per batch, at torch's default intra-op
    threads: on a 32x3x64x64 float input, the batch's own when it is (or holds) a batch
    of images (scaled and cropped to that), a fixed one otherwise (so every cell's step
    costs the same, and competes for the same cores, GIL and allocator)."""

    def __init__(self) -> None:
        from torch import nn

        g = torch.Generator().manual_seed(0)
        self.model = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.fixed = torch.rand(32, 3, 64, 64, generator=g)
        self.labels = torch.randint(0, 10, (32,), generator=g)

    @staticmethod
    def _images(batch: Any) -> Any:
        parts = [batch] if isinstance(batch, torch.Tensor) else _parts(batch)
        for part in parts:
            if isinstance(part, torch.Tensor) and part.dim() == 4 and part.shape[1] == 3:
                return part
        return None

    def __call__(self, batch: Any) -> None:
        x = self._images(batch)
        if x is not None:
            x = x[:32, :, :64, :64].float().div_(255)
            if x.shape != self.fixed.shape:
                x = self.fixed
        else:
            x = self.fixed
        loss = torch.nn.functional.cross_entropy(self.model(x), self.labels[: len(x)])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def gpu_step(batch: Any) -> None:
    """What a GPU step costs the host: 2 ms of Python holding the GIL (kernel launches),
    then 8 ms without it (waiting for the device)."""
    touch_all(batch)
    end = time.perf_counter() + 0.002
    n = 0
    while time.perf_counter() < end:
        n += 1
    time.sleep(0.008)


def _count_only(batch: Any) -> None:
    pass


def consumer_of(kind: str) -> Callable[[Any], None]:
    """The consumer named ``kind``: ``train``, ``gpu``, ``count``, else ``touch``."""
    if kind == "train":
        return TrainStep()
    if kind == "gpu":
        return gpu_step
    if kind == "count":
        return _count_only
    return touch_all
