"""torchvision's folder datasets as staged datasets: the file read apart from the decode.

``torchvision.datasets.DatasetFolder.__getitem__`` calls ``self.loader(path)``, which for
an ``ImageFolder`` with the default loader opens the file and decodes it with PIL in one
call: the wait for the storage and the CPU work sit in the same step, so on network
storage (each open and read a few milliseconds) a worker spends most of its time
waiting. These subclasses keep everything torchvision's classes do (the class scan,
``samples``, ``targets``, ``class_to_idx``, ``find_classes``, ``is_valid_file``, the
transforms) and split ``__getitem__`` into a ``load`` stage that reads the file's bytes
(I/O: torch_spdl's loader runs a batch's reads on threads, so their latencies overlap) and
a ``process`` stage that decodes them exactly as torchvision's PIL loader does (``open``,
``convert("RGB")``) and applies the transforms: the samples are the same as torchvision's,
pixel for pixel, and the same random draws happen in the same order.

Only the loaders whose reading is known are split: torchvision's ``default_loader`` while
the image backend is PIL (checked at each read, as ``default_loader`` itself does) and
``pil_loader``. Any other ``loader=`` is run whole in ``process`` as torchvision runs it,
since it may decode, cache or read several files; the dataset then gains nothing but
loses nothing either.

The classes are subclasses of torchvision's (``isinstance`` checks hold) and of
:class:`~torch_spdl.StagedDataset`, so indexing and torch's own DataLoader work as before.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image
from torchvision import get_image_backend  # type: ignore[import-untyped]
from torchvision.datasets import folder  # type: ignore[import-untyped]

from ..data import StagedDataset

__all__ = ["DatasetFolder", "ImageFolder"]


def _reads_whole_file(loader: Any) -> bool:
    """Whether ``loader(path)`` is torchvision's PIL loading: read the file, decode it."""
    if loader is folder.pil_loader:
        return True
    return loader is folder.default_loader and get_image_backend() == "PIL"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _decode_rgb(data: bytes) -> Image.Image:
    """What ``torchvision.datasets.folder.pil_loader`` returns, from the file's bytes."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


class _StagedFolder(StagedDataset):
    """The two stages, over a torchvision ``DatasetFolder``'s ``samples`` and ``loader``."""

    samples: list[tuple[str, int]]
    loader: Any
    transform: Any
    target_transform: Any

    def load(self, index: int) -> tuple[str, bytes | None, int]:
        """The file of sample ``index`` read whole (``None`` for a loader we do not split),
        with its path and class index."""
        path, target = self.samples[index]
        return path, (_read(path) if _reads_whole_file(self.loader) else None), target

    def process(self, raw: tuple[str, bytes | None, int]) -> tuple[Any, Any]:
        """The sample and target torchvision's ``__getitem__`` returns."""
        path, data, target = raw
        sample = self.loader(path) if data is None else _decode_rgb(data)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    __getitem__ = StagedDataset.__getitem__


class DatasetFolder(_StagedFolder, folder.DatasetFolder):
    """``torchvision.datasets.DatasetFolder``, staged: same arguments, same samples.

    Args:
        root: the root directory (one subdirectory per class).
        loader: reads a sample from its path; torchvision's ``default_loader`` and
            ``pil_loader`` are split into a read (``load``) and a decode (``process``),
            any other runs whole in ``process``.
        extensions: the file extensions accepted (or ``is_valid_file``).
        transform: applied to each sample in ``process``.
        target_transform: applied to each class index in ``process``.
        is_valid_file: picks the files to keep (instead of ``extensions``).
        allow_empty: accept a class directory without files.
    """


class ImageFolder(_StagedFolder, folder.ImageFolder):
    """``torchvision.datasets.ImageFolder``, staged: same arguments, same samples; the file
    is read in ``load`` (I/O) and decoded and transformed in ``process`` (CPU).

    Args:
        root: the root directory (one subdirectory per class).
        transform: applied to each PIL image in ``process``.
        target_transform: applied to each class index in ``process``.
        loader: default torchvision's ``default_loader`` (split into read and decode); any
            other runs whole in ``process``.
        is_valid_file: picks the files to keep (instead of torchvision's image extensions).
        allow_empty: accept a class directory without images.
    """
