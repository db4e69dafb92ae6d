"""Rewriting torch's ``DataLoader`` to ``torch_spdl.DataLoader``, and flagging arguments.

``from torch.utils.data import DataLoader`` becomes ``from torch_spdl import DataLoader``
(other names stay on the torch import); ``torch.utils.data.DataLoader`` (however imported)
becomes ``torch_spdl.DataLoader``. Calls keep every argument; the few whose meaning
differs under torch_spdl are flagged in the report (workers are worker processes seeded
and ordered as torch's, so ``num_workers``, ``worker_init_fn``, ``persistent_workers``,
``prefetch_factor`` and ``multiprocessing_context`` mean what they mean there).
"""

from __future__ import annotations

import libcst as cst

from ._names import dotted

__all__ = ["ARGUMENT_NOTES", "POSITIONAL", "argument_notes", "split_dataloader_import"]

# torch.utils.data.DataLoader's positional parameters, in order.
POSITIONAL = (
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
)

ARGUMENT_NOTES: dict[str, str] = {
    "timeout": "{arg}: bounds the wait for each batch from the whole pipeline, not one worker",
    "pin_memory": (
        "{arg}: pinned on a transfer stage, only when CUDA is available; device= also moves "
        "each batch to the GPU"
    ),
    "pin_memory_device": "{arg}: see pin_memory; device= is the torch_spdl way",
}


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def argument_notes(call: cst.Call) -> list[str]:
    """The report lines for a DataLoader call's arguments whose meaning differs."""
    notes = []
    position = 0
    for arg in call.args:
        if arg.star:
            notes.append(f"{_code(arg)}: arguments passed through * or ** are not checked")
            continue
        if arg.keyword is None:
            name = POSITIONAL[position] if position < len(POSITIONAL) else None
            position += 1
        else:
            name = arg.keyword.value
        if name in ARGUMENT_NOTES:
            text = f"{name}={_code(arg.value)}"
            notes.append(ARGUMENT_NOTES[name].format(arg=text))
    return notes


def _is_dataloader_module(node: cst.ImportFrom) -> bool:
    if node.relative or node.module is None:
        return False
    return dotted(node.module) in ("torch.utils.data", "torch.utils.data.dataloader")


def split_dataloader_import(
    node: cst.ImportFrom,
) -> tuple[cst.ImportFrom | None, cst.ImportAlias | None]:
    """For ``from torch.utils.data import ..., DataLoader, ...``: (the import without
    DataLoader, or ``None`` if nothing is left; DataLoader's alias) -- (node, None) when
    the import has no DataLoader."""
    if not _is_dataloader_module(node) or isinstance(node.names, cst.ImportStar):
        return node, None
    names = list(node.names)
    found = next((a for a in names if dotted(a.name) == "DataLoader"), None)
    if found is None:
        return node, None
    rest = [a for a in names if a is not found]
    if not rest:
        return None, found
    last = rest[-1]
    if not node.rpar:  # no parentheses: no trailing comma allowed
        rest[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return node.with_changes(names=rest), found
