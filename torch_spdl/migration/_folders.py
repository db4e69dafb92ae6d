"""Calls of torchvision's ``ImageFolder`` / ``DatasetFolder``: staged by a name change.

The scripts that read images from files most often do it through torchvision's folder
datasets, not a class of their own, so there is no ``__getitem__`` in the file to split.
:mod:`torch_spdl.vision` has subclasses of both that read the file in a ``load`` stage and
decode it in ``process``, giving torchvision's samples pixel for pixel; a call
``datasets.ImageFolder(...)`` becomes ``torch_spdl.vision.ImageFolder(...)`` with the same
arguments. Only calls are rewritten: ``isinstance`` checks and subclasses keep naming
torchvision's class (an instance of ours passes them).

The split pays only when the loader is torchvision's PIL loader (the default of
``ImageFolder``): a ``loader=`` of the script's own may decode, cache or read several files,
so the read cannot be told from the decode, and the call is left alone with that reason;
so is one whose arguments come through ``*``/``**`` (the loader may be among them).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ._names import ImportMap

__all__ = ["FOLDER_STAGES", "FolderCall", "folder_call"]

FOLDER_STAGES = ["load (io)", "process (cpu)"]

_CLASSES = {
    f"torchvision.datasets{sub}.{name}": name
    for sub in ("", ".folder")
    for name in ("ImageFolder", "DatasetFolder")
}
_PIL_LOADERS = frozenset(
    f"torchvision.datasets{sub}.{name}"
    for sub in ("", ".folder")
    for name in ("default_loader", "pil_loader")
)
# Where each class takes ``loader`` positionally (after ``root``...).
_LOADER_POSITION = {"ImageFolder": 3, "DatasetFolder": 1}


@dataclass(frozen=True)
class FolderCall:
    """A call of a torchvision folder dataset: ``name`` (``ImageFolder``...) and, when it is
    left alone, why (``reason``)."""

    name: str
    reason: str | None


def _loader_argument(call: cst.Call, name: str) -> cst.Arg | None:
    position = 0
    for arg in call.args:
        if arg.keyword is None and not arg.star:
            if position == _LOADER_POSITION[name]:
                return arg
            position += 1
        elif arg.keyword is not None and arg.keyword.value == "loader":
            return arg
    return None


def folder_call(call: cst.Call, imports: ImportMap) -> FolderCall | None:
    """Whether ``call`` builds a torchvision folder dataset, and whether to stage it."""
    name = _CLASSES.get(imports.resolve(call.func) or "")
    if name is None:
        return None
    if any(arg.star for arg in call.args):
        return FolderCall(name, "its arguments come through * or **, which may set loader=")
    loader = _loader_argument(call, name)
    if loader is None:
        if name == "DatasetFolder":  # loader is required: a call without one fails anyway
            return FolderCall(name, "no loader= is given")
        return FolderCall(name, None)
    if imports.resolve(loader.value) in _PIL_LOADERS:
        return FolderCall(name, None)
    shown = cst.Module([]).code_for_node(loader.value)
    return FolderCall(
        name,
        f"loader={shown} is not torchvision's PIL loader: it may decode, cache or read "
        "several files, so its read cannot be told from its decode",
    )
