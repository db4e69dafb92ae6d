"""The package's imports run one way: no cycle, ``TYPE_CHECKING`` imports included, none
among the folders (the private subpackages, which are layers), and no module imports
another package's private module.

Checked on the source (``scripts/import_cycles.py``), so a cycle shows up here even when
it would only bite a type checker or a reader.
"""

from __future__ import annotations

from typing import Any

from _scripts import ROOT, load_script


def _checker() -> Any:
    return load_script("import_cycles")


def test_no_import_cycle_in_the_package() -> None:
    module = _checker()
    graph = module.build_graph(ROOT / "torch_spdl")
    assert "torch_spdl.pipeline._stage_kinds.node" in graph  # the walk found the modules
    assert module.strongly_connected(graph) == []


def test_no_module_imports_another_packages_private_module() -> None:
    module = _checker()
    root = ROOT / "torch_spdl"
    graph = module.build_graph(root)
    # the check itself sees a crossing: data importing one of pipeline's private modules
    planted = {**graph, "torch_spdl.data._epoch": {"torch_spdl.pipeline._wire.channel"}}
    assert module.private_crossings(root, planted) == [
        ("torch_spdl.data._epoch", "torch_spdl.pipeline._wire.channel")
    ]
    # a folder of pipeline importing a sibling folder's module stays inside pipeline
    inside = {"torch_spdl.pipeline._a.x": {"torch_spdl.pipeline._b.y"}}
    assert module.private_crossings(root, inside) == []
    # the parent package's private modules (the process wire) are shared with its
    # subpackages, but a subpackage's private modules are not the parent's to import
    shared = {"torch_spdl.data._epoch": {"torch_spdl._procwire.messages"}}
    assert module.private_crossings(root, shared) == []
    upward = {"torch_spdl._procwire.messages": {"torch_spdl.data._epoch"}}
    assert module.private_crossings(root, upward) == [
        ("torch_spdl._procwire.messages", "torch_spdl.data._epoch")
    ]
    assert module.private_crossings(root, graph) == []


def test_the_folders_import_one_way() -> None:
    module = _checker()
    root = ROOT / "torch_spdl"
    graph = module.build_graph(root)
    folders = module.folder_graph(root, graph)
    assert module.strongly_connected(folders) == []
    # the check itself sees a folder cycle: a stage importing the runtime's folder, which
    # imports the stages (each module graph alone stays acyclic)
    planted = {
        **graph,
        "torch_spdl.pipeline._stage_kinds.source": {"torch_spdl.pipeline._run.runtime"},
    }
    assert module.strongly_connected(module.folder_graph(root, planted)) != []
