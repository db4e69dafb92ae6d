"""One pass over a parsed module: DataLoader rewrites, Dataset splits, imports."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ._dataset import DatasetPlan, apply_plan, plan_datasets
from ._folders import FOLDER_STAGES, FolderCall, folder_call
from ._imports import ensure_imports
from ._loader import argument_notes, split_dataloader_import
from ._names import ImportMap, walk
from ._report import Decision
from ._tables import DATALOADER_NAMES, LIBRARY_LOADERS

__all__ = ["migrate_module"]


class _Migrator(cst.CSTTransformer):
    def __init__(
        self,
        imports: ImportMap,
        line_of: Callable[[cst.CSTNode], int],
        plans: dict[cst.ClassDef, DatasetPlan],
        folders: dict[cst.Call, FolderCall],
        decisions: list[Decision],
    ) -> None:
        super().__init__()
        self.imports = imports
        self.line_of = line_of
        self.plans = plans
        self.folders = folders
        self.staged = bool(plans) or any(f.reason is None for f in folders.values())
        self.decisions = decisions
        self.names: list[tuple[str, str | None]] = []  # to import from torch_spdl
        self.want_module = False  # `import torch_spdl` needed
        self.want_vision = False  # `import torch_spdl.vision` needed

    def _note(self, node: cst.CSTNode, kind: str, message: str) -> None:
        self.decisions.append(Decision(self.line_of(node), kind, message))  # type: ignore[arg-type]

    # -- imports --------------------------------------------------------------------------
    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom | cst.RemovalSentinel:
        rest, alias = split_dataloader_import(updated_node)
        if alias is None:
            return updated_node
        asname = alias.asname.name.value if alias.asname else None  # type: ignore[union-attr]
        shown = f"DataLoader as {asname}" if asname else "DataLoader"
        if rest is None:
            self._note(
                original_node,
                "import",
                f"from torch.utils.data import {shown} -> from torch_spdl import {shown}",
            )
            return updated_node.with_changes(
                module=cst.Name("torch_spdl"),
                relative=[],
                names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)],
                lpar=None,
                rpar=None,
            )
        self._note(
            original_node,
            "import",
            f"{shown} now imported from torch_spdl; the other names stay on the torch import",
        )
        self.names.append(("DataLoader", asname))
        return rest

    # -- names and calls ----------------------------------------------------------------------
    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        name = self.imports.resolve(original_node)
        if name in DATALOADER_NAMES:
            self.want_module = True
            self._note(
                original_node,
                "call",
                f"{cst.Module([]).code_for_node(original_node)} -> torch_spdl.DataLoader",
            )
            return cst.Attribute(value=cst.Name("torch_spdl"), attr=cst.Name("DataLoader"))
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        folder = self.folders.get(original_node)
        if folder is not None:
            return self._folder(original_node, updated_node, folder)
        name = self.imports.resolve(original_node.func)
        if name in DATALOADER_NAMES:
            for note in argument_notes(original_node):
                self._note(original_node, "argument", f"DataLoader(...): {note}")
            if self.staged:
                self._note(
                    original_node,
                    "note",
                    "DataLoader(...): a staged dataset runs in the num_workers worker "
                    "processes, as torch's: each runs a batch's load stages on threads of its "
                    "own (up to io_concurrency; default: the batch, at most 64), then process",
                )
        elif name is not None and name in LIBRARY_LOADERS:
            code = cst.Module([]).code_for_node(original_node.func)
            self._note(
                original_node,
                "library",
                f"{code}(...) builds torch's DataLoader inside {name.split('.')[0]}, out of "
                "reach of the import swap; to load with torch_spdl, run this line before "
                f"it: {LIBRARY_LOADERS[name]}",
            )
        return updated_node

    def _folder(self, original: cst.Call, updated: cst.Call, folder: FolderCall) -> cst.Call:
        code = cst.Module([]).code_for_node(original.func)
        if folder.reason is not None:
            self.decisions.append(
                Decision(
                    self.line_of(original),
                    "kept",
                    f"{code}(...): left as torchvision's {folder.name}: {folder.reason}",
                    name=folder.name,
                )
            )
            return updated
        self.want_vision = True
        self.decisions.append(
            Decision(
                self.line_of(original),
                "split",
                f"{code}(...) -> torch_spdl.vision.{folder.name}(...): torchvision's class "
                "with 2 stages: load (io, reads the file) -> process (cpu, decodes it as "
                "torchvision's PIL loader does, then the transforms); same samples",
                name=folder.name,
                stages=list(FOLDER_STAGES),
            )
        )
        func = cst.parse_expression(f"torch_spdl.vision.{folder.name}")
        return updated.with_changes(func=func)

    # -- datasets -------------------------------------------------------------------------
    def leave_ClassDef(
        self, original_node: cst.ClassDef, updated_node: cst.ClassDef
    ) -> cst.ClassDef:
        plan = self.plans.get(original_node)
        if plan is None:
            return updated_node
        if ("StagedDataset", None) not in self.names:
            self.names.append(("StagedDataset", None))
        return apply_plan(updated_node, plan)


def migrate_module(module: cst.Module) -> tuple[cst.Module, list[Decision]]:
    """The migrated module and the decisions made (in source order)."""
    wrapper = MetadataWrapper(module)
    positions = wrapper.resolve(PositionProvider)
    tree = wrapper.module

    def line_of(node: cst.CSTNode) -> int:
        return positions[node].start.line

    imports = ImportMap(tree)
    decisions: list[Decision] = []
    plans = plan_datasets(tree, imports, line_of, decisions)
    folders = {
        node: found
        for node in walk(tree, into_scopes=True)
        if isinstance(node, cst.Call) and (found := folder_call(node, imports)) is not None
    }
    migrator = _Migrator(imports, line_of, plans, folders, decisions)
    new = tree.visit(migrator)
    new = ensure_imports(new, migrator.names, migrator.want_module, migrator.want_vision)
    decisions.sort(key=lambda d: d.line)
    return new, decisions
