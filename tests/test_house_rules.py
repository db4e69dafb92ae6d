"""The house rules hold on the tree: every piece small enough to hold (files, classes,
functions), no two names one edit apart, no import circle among the benchmarks
(``scripts/house_rules.py``), and every module of the package in ``docs/engine.md``'s
module map, so a newcomer finds each one's job there."""

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
