"""The package's imports run one way: no cycle, ``TYPE_CHECKING`` imports included, none
among the folders (the private subpackages, which are layers: ``pipeline/``'s and
``data/``'s), no folder importing its package's face (the files at its top), and no module
imports another package's private module.

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
    planted = {**graph, "torch_spdl.data._epoch.epoch": {"torch_spdl.pipeline._wire.channel"}}
    assert module.private_crossings(root, planted) == [
        ("torch_spdl.data._epoch.epoch", "torch_spdl.pipeline._wire.channel")
    ]
    # a folder of pipeline importing a sibling folder's module stays inside pipeline
    inside = {"torch_spdl.pipeline._a.x": {"torch_spdl.pipeline._b.y"}}
    assert module.private_crossings(root, inside) == []
    # the parent package's private modules (the process wire) are shared with its
    # subpackages, but a subpackage's private modules are not the parent's to import
    shared = {"torch_spdl.data._epoch.epoch": {"torch_spdl._procwire.messages"}}
    assert module.private_crossings(root, shared) == []
    upward = {"torch_spdl._procwire.messages": {"torch_spdl.data._epoch.epoch"}}
    assert module.private_crossings(root, upward) == [
        ("torch_spdl._procwire.messages", "torch_spdl.data._epoch.epoch")
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


def test_the_data_folders_import_one_way() -> None:
    module = _checker()
    root = ROOT / "torch_spdl"
    graph = module.build_graph(root)
    folders = module.folder_graph(root, graph)
    data = {name for name in folders if name.startswith("torch_spdl.data.")}
    # the walk found data's folders, each one node, and the epoch above the loading layer
    assert {"torch_spdl.data._epoch", "torch_spdl.data._loading"} <= data
    assert "torch_spdl.data._loading" in folders["torch_spdl.data._epoch"]
    assert module.strongly_connected({k: folders[k] & data for k in data}) == []
    # a backward import between two of data's folders closes a folder cycle, although the
    # module graph alone stays acyclic: fetching a batch timing itself with the clock of
    # ``worker_type="auto"``
    planted = {
        **graph,
        "torch_spdl.data._loading.fetch": graph["torch_spdl.data._loading.fetch"]
        | {"torch_spdl.data._epoch.thread_or_process"},
    }
    assert module.strongly_connected(planted) == []
    cycles = module.strongly_connected(module.folder_graph(root, planted))
    assert len(cycles) == 1  # the folders between them are caught in it too
    assert {"torch_spdl.data._epoch", "torch_spdl.data._loading"} <= set(cycles[0])


def test_no_folder_imports_its_packages_face() -> None:
    module = _checker()
    root = ROOT / "torch_spdl"
    graph = module.build_graph(root)
    assert module.face_imports(root, graph) == []
    # a worker process importing the DataLoader's module, or data's __init__, is reported
    planted = {
        **graph,
        "torch_spdl.data._workers.process_pool": {"torch_spdl.data._dataloader"},
        "torch_spdl.data._epoch.caller": {"torch_spdl.data"},
    }
    assert module.face_imports(root, planted) == [
        ("torch_spdl.data._epoch.caller", "torch_spdl.data"),
        ("torch_spdl.data._workers.process_pool", "torch_spdl.data._dataloader"),
    ]
    # a folder's own face (its __init__) and a sibling folder are not the package's face
    inside = {"torch_spdl.data._epoch.caller": {"torch_spdl.data._loading"}}
    assert module.face_imports(root, inside) == []
