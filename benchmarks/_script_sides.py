"""The three sides of every training script that ``real_scripts.py`` runs: as written
(torch's loader), with only the import swapped, and after ``torch-spdl migrate --write``;
and the command line of each script.

Why real files: ``migrate`` rewrites source files, and it must see each script as a user's
copy of the public one, whole (its imports, its dataset classes, its module-level
helpers), so the scripts live in ``benchmarks/training_scripts/`` as programs of their own
and each side is a file written from them into a temporary directory:
``SIDE/NAME.py``, run as ``python SIDE/NAME.py ARGS`` (a fresh process, as a user runs
it). ``swap`` is what a user does by hand: ``from torch.utils.data import ..., DataLoader``
gets ``DataLoader`` from ``torch_spdl`` instead, and ``torch.utils.data.DataLoader(`` becomes
``torch_spdl.DataLoader(`` with ``import torch_spdl``; nothing else changes. ``migrate``
is the tool run once over the copies (``python -m torch_spdl migrate --write --no-diff
--report-json``), its report kept for the benchmark's output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).with_name("training_scripts")
SIDES = ("torch", "swap", "migrate")


@dataclass(frozen=True)
class Script:
    """One row: a file of ``training_scripts/`` and its arguments (``{data}``, ``{epochs}``
    filled in per run); ``reads_files``: it opens a file per sample, so it has a row on the
    latency store too."""

    name: str
    file: str
    args: tuple[str, ...]
    reads_files: bool = True
    quick_args: tuple[str, ...] = ()

    def argv(self, side_dir: Path, data: str, epochs: int, quick: bool) -> list[str]:
        args = [a.format(data=data, epochs=epochs) for a in self.args]
        return [
            sys.executable,
            str(side_dir / self.file),
            *args,
            *(self.quick_args if quick else ()),
        ]


SCRIPTS = (
    Script("imagenet", "imagenet.py", ("{data}", "--epochs", "{epochs}")),
    Script(
        "dummy",
        "imagenet.py",
        ("{data}", "--dummy", "--epochs", "{epochs}"),
        reads_files=False,
        quick_args=("--dummy-images", "384"),
    ),
    Script("superres", "superres.py", ("{data}", "--nEpochs", "{epochs}")),
    Script("detection", "detection.py", ("{data}", "--epochs", "{epochs}")),
    Script(
        "classification",
        "classification.py",
        ("--data-path", "{data}", "--device", "cpu", "--epochs", "{epochs}"),
    ),
    Script(
        "lightning",
        "lightning_backbone.py",
        ("{data}", "--max_epochs", "{epochs}"),
        reads_files=False,
    ),
)

_FROM = re.compile(r"from torch\.utils\.data import (?P<names>[^()\n]+)\n")


def swap_source(text: str) -> str:
    """``text`` with torch's ``DataLoader`` swapped for torch_spdl's by its import alone."""
    out, spelled = [], False
    for line in text.splitlines(keepends=True):
        m = _FROM.fullmatch(line)
        names = [n.strip() for n in m["names"].split(",")] if m else []
        if "DataLoader" in names:
            rest = [n for n in names if n != "DataLoader"]
            out += [f"from torch.utils.data import {', '.join(rest)}\n"] if rest else []
            out.append("from torch_spdl import DataLoader\n")
            continue
        if "torch.utils.data.DataLoader(" in line:
            line, spelled = (
                line.replace("torch.utils.data.DataLoader(", "torch_spdl.DataLoader("),
                True,
            )
        out.append(line)
    if spelled:  # the new name imported beside torch's first import
        first = next(i for i, line in enumerate(out) if line.startswith("import torch"))
        out.insert(first, "import torch_spdl\n")
    swapped = "".join(out)
    if swapped == text:
        raise ValueError("no DataLoader import or call to swap")
    return swapped


def write_sides(root: Path) -> dict[str, list[str]]:
    """``root/SIDE/*.py`` for the three sides; returns what migrate reported, by file:
    its text report's lines for that file (the split or why it left a class alone)."""
    files = sorted({s.file for s in SCRIPTS})
    for side in SIDES:
        (root / side).mkdir(parents=True)
        for name in files:
            text = (SOURCES / name).read_text()
            (root / side / name).write_text(swap_source(text) if side == "swap" else text)
    cmd = [sys.executable, "-m", "torch_spdl", "migrate", "--write", "--no-diff"]
    cmd += ["--report-json", str(root / "migrate.json"), str(root / "migrate")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(f"torch-spdl migrate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report: dict[str, list[str]] = {name: [] for name in files}
    for entry in json.loads((root / "migrate.json").read_text()):
        name = Path(entry["path"]).name
        status = entry["status"] + (", written" if entry.get("written") else "")
        report[name] = [status] + [
            f"line {d['line']}: {d['kind']}: {d['message']}" for d in entry["decisions"]
        ]
    return report
