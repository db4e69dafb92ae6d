"""The migration tool on one case: diff, report, and the same batches before and after.

    .venv/bin/python examples/migration_before_after.py --quick
    .venv/bin/python examples/migration_before_after.py --case http_download

Copies ``tests/migration_cases/<case>/before.py`` into a temporary directory, makes the case's
data there, runs ``python -m torch_spdl migrate`` on it (a dry run: the diff and the
report), then ``--write``; imports both versions, loads every batch through torch's
DataLoader (original) and torch_spdl's (migrated), and checks they are identical. Exits
non-zero if they are not.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

CASES = Path(__file__).resolve().parent.parent / "tests" / "migration_cases"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def epochs(loader: Any, n: int) -> tuple[list[Any], float]:
    start = time.perf_counter()
    batches = [batch for _ in range(n) for batch in loader]
    return batches, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", default="image_folder", help="a folder of tests/migration_cases")
    parser.add_argument("--quick", action="store_true", help="one epoch (for the test suite)")
    args = parser.parse_args()
    case_dir = CASES / args.case
    if not (case_dir / "before.py").exists():
        print(f"no such case: {case_dir}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        (work / "data").mkdir()
        original = work / "train_before.py"
        migrated = work / "train_after.py"
        shutil.copy(case_dir / "before.py", original)
        shutil.copy(case_dir / "before.py", migrated)
        kwargs = load(case_dir / "data.py", "case_data").make_data(work / "data", stack)

        tool = [sys.executable, "-m", "torch_spdl", "migrate"]
        print(f"$ python -m torch_spdl migrate {migrated.name}")
        dry = subprocess.run([*tool, migrated.name], capture_output=True, text=True, cwd=work)
        print(dry.stdout + dry.stderr)
        done = subprocess.run([*tool, "--write", "--quiet", migrated.name], cwd=work)
        if dry.returncode or done.returncode:
            print("the tool failed", file=sys.stderr)
            return 1

        before = load(original, "train_before")
        after = load(migrated, "train_after")
        n = 1 if args.quick else 3
        theirs = before.make_loader(**kwargs, num_workers=0)
        ours = after.make_loader(**kwargs, num_workers=2)
        expected, t_torch = epochs(theirs, n)
        got, t_ours = epochs(ours, n)
        ours.shutdown()
        print(f"torch.utils.data.DataLoader (original): {len(expected)} batches, {t_torch:.3f} s")
        print(f"torch_spdl.DataLoader (migrated):       {len(got)} batches, {t_ours:.3f} s")
        if not expected or not same(got, expected):
            print("same batches: FAILED", file=sys.stderr)
            return 1
        print("same batches: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
