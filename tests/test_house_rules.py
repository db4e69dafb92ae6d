"""The house rules hold on the tree: every piece small enough to hold (files, classes,
functions), no two names one edit apart, no import circle among the benchmarks
(``scripts/house_rules.py``), and every module of the package in ``docs/engine.md``'s
module map, each module of a folder in that folder's section, so a newcomer finds each
one's job, and its layer, there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from _scripts import ROOT, load_script


def _rules() -> Any:
    return load_script("house_rules")


def test_no_file_class_or_function_over_the_size_limits() -> None:
    assert _rules().size_findings(ROOT / "torch_spdl") == []


def test_no_two_names_one_edit_apart() -> None:
    rules = _rules()
    assert rules.one_edit_apart("trace", "tracer")  # the check itself sees a close pair
    assert rules.close_names(ROOT / "torch_spdl") == []


def test_no_import_cycle_among_the_benchmarks() -> None:
    assert _rules().benchmark_cycles(ROOT / "benchmarks") == []


def test_every_benchmark_has_a_module_docstring(tmp_path: Path) -> None:
    rules = _rules()
    assert rules.benchmark_docstrings(ROOT / "benchmarks") == []
    (tmp_path / "told.py").write_text('"""Measures one thing, because."""\n')
    (tmp_path / "mute.py").write_text("import told\n")
    assert rules.benchmark_docstrings(tmp_path) == [
        f"{tmp_path / 'mute.py'}: no module docstring (say what it measures and why)"
    ]


def test_no_benchmark_over_the_size_limits() -> None:
    assert _rules().benchmark_size_findings(ROOT / "benchmarks") == []


def test_the_benchmark_size_check_sees_a_long_file(tmp_path: Path) -> None:
    rules = _rules()
    (tmp_path / "short.py").write_text('"""Short."""\n')
    (tmp_path / "long.py").write_text('"""Long."""\n' + "x = 1\n" * rules.MAX_FILE_LINES)
    limit = rules.MAX_FILE_LINES
    found = rules.benchmark_size_findings(tmp_path)
    assert found == [f"{tmp_path / 'long.py'}: {limit + 1} lines (at most {limit})"]
    assert rules.benchmark_size_findings(tmp_path / "absent") == []


def test_every_module_is_in_the_module_map() -> None:
    text = (ROOT / "docs" / "engine.md").read_text()
    quoted = set(re.findall(r"`([^`]+\.py)`", text))
    named = {Path(q).name for q in quoted} | {q for q in quoted}
    missing = []
    for path in sorted((ROOT / "torch_spdl").rglob("*.py")):
        rel = path.relative_to(ROOT / "torch_spdl").as_posix()
        if path.name == "__init__.py" and path.parent != ROOT / "torch_spdl":
            continue  # a folder's face: the folder's section names it
        if rel not in named and path.name not in named:
            missing.append(rel)
    assert missing == []


def test_each_folder_has_its_section_in_the_module_map() -> None:
    """Every private folder (``pipeline/_run/``, ``data/_epoch/``, ...) has a section of its
    own, headed by its path, that names each of its modules: the map shows the layers."""
    text = (ROOT / "docs" / "engine.md").read_text()
    sections = {}
    for block in re.split(r"^#### ", text, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        found = re.match(r"`torch_spdl/([\w/]+)/`", heading)
        if found:
            sections[found.group(1)] = body
    missing = []
    for init in sorted((ROOT / "torch_spdl").rglob("__init__.py")):
        folder = init.parent.relative_to(ROOT / "torch_spdl").as_posix()
        if not init.parent.name.startswith("_"):
            continue  # a public package: its modules are in "The other packages"
        body = sections.get(folder)
        for path in sorted(init.parent.glob("*.py")):
            if path.name != "__init__.py" and (body is None or f"`{path.name}`" not in body):
                missing.append(f"{folder}/{path.name}")
    assert missing == []
