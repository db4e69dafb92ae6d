"""``torch_spdl.vision``: torchvision's folder datasets, staged, give torchvision's samples.

Side by side with torchvision's own ``ImageFolder`` under torch's DataLoader: the same
batches, pixel for pixel, with seeded random crops and flips drawn in worker processes;
and the read apart from the decode only for the loaders whose reading is known.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision
from _dl_helpers import assert_same_batches, gen
from PIL import Image
from torch.utils.data import DataLoader as TorchDataLoader
from torchvision import transforms
from torchvision.datasets import folder

import torch_spdl.vision
from torch_spdl import DataLoader, StagedDataset


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two classes of JPEGs of several sizes, a greyscale PNG and an RGBA PNG (which the
    PIL loader converts to RGB), and a file that is not an image (skipped by extension)."""
    base = tmp_path_factory.mktemp("folders")
    rng = np.random.default_rng(11)
    for c, name in enumerate(["ants", "bees"]):
        (base / name).mkdir()
        for i in range(9 + c):
            pixels = rng.integers(0, 256, (40 + 3 * i, 36 + c, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(base / name / f"{i:02d}.jpg", quality=80)
    Image.fromarray(rng.integers(0, 256, (33, 31), dtype=np.uint8)).save(base / "ants/g.png")
    rgba = rng.integers(0, 256, (30, 30, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(base / "bees" / "a.png")
    (base / "bees" / "notes.txt").write_text("not an image")
    return base


def _augment() -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(24),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )


@pytest.mark.parametrize("num_workers", [2, 3])
def test_same_batches_as_torchvision_under_torch(root: Path, num_workers: int) -> None:
    """Two epochs, shuffled by a seeded generator, random augmentation in the workers."""

    def batches(loader: Any) -> list[Any]:
        return [b for _ in range(2) for b in loader]

    ref = TorchDataLoader(
        torchvision.datasets.ImageFolder(str(root), _augment()),
        batch_size=4,
        shuffle=True,
        generator=gen(5),
        num_workers=num_workers,
    )
    ours = DataLoader(
        torch_spdl.vision.ImageFolder(str(root), _augment()),
        batch_size=4,
        shuffle=True,
        generator=gen(5),
        num_workers=num_workers,
    )
    try:
        expected, got = batches(ref), batches(ours)
    finally:
        ours.shutdown()
    assert_same_batches(got, expected)
    assert len(got) == 2 * 6


def test_torchs_loader_and_indexing_give_the_same_samples(root: Path) -> None:
    """Without torch_spdl's loader the staged class is still torchvision's dataset: same
    classes, samples and targets, and ``dataset[i]`` equal to torchvision's."""
    theirs = torchvision.datasets.ImageFolder(str(root))
    ours = torch_spdl.vision.ImageFolder(str(root))
    assert isinstance(ours, torchvision.datasets.ImageFolder)
    assert isinstance(ours, StagedDataset)
    assert (ours.classes, ours.class_to_idx) == (theirs.classes, theirs.class_to_idx)
    assert ours.samples == theirs.samples and ours.targets == theirs.targets
    assert len(ours) == len(theirs) == 21
    for i in range(len(ours)):
        (a, ta), (b, tb) = ours[i], theirs[i]
        assert (a.mode, a.size, ta) == (b.mode, b.size, tb) == ("RGB", b.size, tb)
        assert a.tobytes() == b.tobytes(), f"sample {i}"


def test_the_stages_read_then_decode(root: Path) -> None:
    dataset = torch_spdl.vision.ImageFolder(str(root), target_transform=lambda t: t + 10)
    assert [(s.name, s.kind) for s in dataset.stages()] == [("load", "io"), ("process", "cpu")]
    path, data, target = dataset.load(0)
    assert (path, target) == dataset.samples[0]
    assert data == Path(path).read_bytes()  # the whole file, read in the io stage
    image, label = dataset.process((path, data, target))
    assert image.tobytes() == folder.pil_loader(path).tobytes() and label == target + 10


def _npy_loader(path: str) -> np.ndarray:
    return np.load(path)


def test_a_loader_of_ones_own_runs_whole_in_process(tmp_path: Path) -> None:
    """A loader that is not torchvision's PIL loader may do anything with the path: it is
    not read ahead, and runs in ``process`` as torchvision runs it."""
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            np.save(tmp_path / c / f"{i}.npy", np.full((2,), 10 * i + ord(c)))
    theirs = torchvision.datasets.DatasetFolder(str(tmp_path), _npy_loader, (".npy",))
    ours = torch_spdl.vision.DatasetFolder(str(tmp_path), _npy_loader, (".npy",))
    assert ours.load(4) == (ours.samples[4][0], None, 1)
    loader = DataLoader(ours, batch_size=2, num_workers=2)
    try:
        got = list(loader)
    finally:
        loader.shutdown()
    assert_same_batches(got, list(TorchDataLoader(theirs, batch_size=2)))


def test_the_image_backend_is_read_at_each_load(root: Path) -> None:
    """``default_loader`` follows ``torchvision.set_image_backend``; so does the split: with
    accimage chosen, nothing is read ahead and torchvision's loader runs whole."""
    dataset = torch_spdl.vision.ImageFolder(str(root))
    before = torchvision.get_image_backend()
    torchvision.set_image_backend("accimage")
    try:
        assert dataset.load(1)[1] is None
    finally:
        torchvision.set_image_backend(before)
    assert dataset.load(1)[1] is not None
    assert torch_spdl.vision.ImageFolder(str(root), loader=folder.pil_loader).load(1)[1]


class _Flagged(torch_spdl.vision.ImageFolder):
    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image, target = super().__getitem__(index)
        return image, ("flagged", target)


def test_a_subclass_overriding_getitem_is_run_whole(root: Path) -> None:
    dataset = _Flagged(
        str(root), transforms.Compose([transforms.CenterCrop(8), transforms.PILToTensor()])
    )
    assert [s.name for s in dataset.stages()] == ["getitem"]
    loader = DataLoader(dataset, batch_size=3, num_workers=2)
    try:
        first = next(iter(loader))
    finally:
        loader.shutdown()
    assert tuple(first[1][0]) == ("flagged",) * 3


def test_pickles_as_torchvisions_does(root: Path) -> None:
    dataset = torch_spdl.vision.ImageFolder(str(root), transforms.PILToTensor())
    copy = pickle.loads(pickle.dumps(dataset))
    assert type(copy) is torch_spdl.vision.ImageFolder and copy.samples == dataset.samples
    assert torch.equal(copy[3][0], dataset[3][0])
