"""The package's imports run one way: no cycle, ``TYPE_CHECKING`` imports included.

Checked on the source (``scripts/import_cycles.py``), so a cycle shows up here even when
it would only bite a type checker or a reader.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_cycle_in_the_package() -> None:
    spec = importlib.util.spec_from_file_location(
        "import_cycles", ROOT / "scripts" / "import_cycles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = module.build_graph(ROOT / "torch_spdl")
    assert "torch_spdl.pipeline._node" in graph  # the walk found the modules
    assert module.strongly_connected(graph) == []
