"""Run PyTorch's and SPDL's own test files against their library and against torch_spdl.

Why: torch_spdl promises that code written for ``torch.utils.data.DataLoader`` or for
``spdl.pipeline`` keeps working with only the import swapped. The strongest check of that
promise is the other project's own tests, run as a user would run them: unchanged, with
only the class or the import swapped. Their files are not ours to copy into this
repository, so this script takes the paths of copies the caller fetched (see
docs/spdl-compat.md, "Running SPDL's and PyTorch's own tests"), works on them in a
temporary directory, and fetches nothing.

- ``torch FILE``: PyTorch's ``test/test_dataloader.py``. Run once as it is (torch's
  loader) and once with ``DataLoader`` taken from ``torch_spdl`` instead (the import at
  the top, ``torch.utils.data.DataLoader(...)`` calls and the scripts it runs in
  subprocesses).
- ``spdl DIR``: a directory of SPDL's pipeline test files. Run once against the installed
  ``spdl`` and once with a shim package named ``spdl`` first on the path, which answers
  ``spdl.pipeline``, ``spdl.pipeline.defs``, ``spdl.source`` and ``spdl.source.utils`` with
  torch_spdl's modules. A private SPDL module (``spdl.pipeline._components``, ...) is
  answered by a stub whose every name raises when used, so the tests that reach into
  SPDL's internals fail one by one instead of taking their whole file down.

Each run prints pytest's summary and the failing tests. ``--deps DIR`` adds a directory to
the path of both runs (the upstream files need ``expecttest``, ``parameterized``);
``--only`` picks one side; arguments after ``--`` go to pytest.

Usage:
    python scripts/upstream_tests.py torch /tmp/upstream/torch/test_dataloader.py --deps DIR
    python scripts/upstream_tests.py spdl /tmp/upstream/spdl/pipeline --deps DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent

_SHIM = '''"""Shim: spdl's public pipeline modules answered by torch_spdl's."""
import importlib
import importlib.abc
import importlib.util
import sys
import types

_PUBLIC = {
    "spdl.pipeline": "torch_spdl.pipeline",
    "spdl.pipeline.defs": "torch_spdl.pipeline.defs",
    "spdl.source": "torch_spdl.source",
    "spdl.source.utils": "torch_spdl.source.utils",
}


class _PrivateName:
    def __init__(self, name):
        self._name = name

    def _fail(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is SPDL's internal, not part of its public API")

    __call__ = __iter__ = __enter__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _PrivateName(f"{self._name}.{attr}")


class _Private(types.ModuleType):
    """A private SPDL module. A name that SPDL also exports publicly (a test importing
    ``StageInfo`` from where SPDL defines it) is torch_spdl's public one."""

    __path__: list = []

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        public = importlib.import_module("torch_spdl.pipeline")
        if not attr.startswith("_") and attr in getattr(public, "__all__", ()):
            return getattr(public, attr)
        return _PrivateName(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        target = _PUBLIC.get(spec.name)
        return importlib.import_module(target) if target else _Private(spec.name)

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("spdl."):
            return None
        return importlib.util.spec_from_loader(
            fullname, _Loader(), is_package=fullname not in _PUBLIC
        )


sys.meta_path.insert(0, _Finder())
'''


def _swap_torch(text: str) -> str:
    """PyTorch's test file with ``DataLoader`` taken from torch_spdl, nothing else changed."""
    text = text.replace("    DataLoader,\n", "", 1)
    text = text.replace(
        "from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL\n",
        "from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL\n"
        "from torch_spdl import DataLoader\n",
        1,
    )
    text = text.replace("torch.utils.data.DataLoader(", "DataLoader(")
    return text.replace(
        "from torch.utils.data import DataLoader, IterableDataset\n",
        "from torch.utils.data import IterableDataset\nfrom torch_spdl import DataLoader\n",
    )


def _pytest(cwd: Path, target: str, path: list[str], extra: list[str]) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*path, str(ROOT)])
    report = cwd / "report.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", target]
    cmd += [f"--junitxml={report}"]
    proc = subprocess.run(
        [*cmd, *extra], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    lines = proc.stdout.splitlines()
    failed = [line for line in lines if re.match(r"(FAILED|ERROR) \S+\.py", line)]
    summary = [line for line in lines if re.search(r"\d+ (passed|failed)", line)]
    for line in failed:
        print("   ", line[:160])
    if not summary:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    print("   ", summary[-1] if summary else f"(no summary; exit {proc.returncode})")
    if report.exists():
        internal = _failed_on_internals(report)
        if internal:
            print(f"    of the failures, {internal} reached a private SPDL name (see the shim)")
    return proc.returncode


def _failed_on_internals(report: Path) -> int:
    """Failed tests whose error is the shim's: they used a private SPDL name."""
    count = 0
    for case in ElementTree.parse(report).iter("testcase"):
        for outcome in (*case.iter("failure"), *case.iter("error")):
            if "is SPDL's internal" in (outcome.get("message", "") + (outcome.text or "")):
                count += 1
                break
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=["torch", "spdl"])
    parser.add_argument("path", type=Path, help="test_dataloader.py, or SPDL's test directory")
    parser.add_argument("--deps", action="append", default=[], help="extra sys.path entry")
    parser.add_argument("--only", choices=["upstream", "ours"], help="run one side only")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    deps = [str(Path(d).resolve()) for d in args.deps]
    with tempfile.TemporaryDirectory(prefix="upstream_tests_") as tmp:
        work = Path(tmp)
        if args.suite == "torch":
            text = args.path.read_text()
            (work / "upstream").mkdir()
            (work / "ours").mkdir()
            (work / "upstream" / "test_dataloader.py").write_text(text)
            (work / "ours" / "test_dataloader.py").write_text(_swap_torch(text))
            runs = {"upstream": ("torch.utils.data.DataLoader", []), "ours": ("torch_spdl", [])}
            target = "test_dataloader.py"
        else:
            shutil.copytree(args.path, work / "upstream" / "tests")
            shutil.copytree(args.path, work / "ours" / "tests")
            shim = work / "shim" / "spdl"
            shim.mkdir(parents=True)
            (shim / "__init__.py").write_text(_SHIM)
            runs = {"upstream": ("installed spdl", []), "ours": ("torch_spdl", [str(shim.parent)])}
            target = "tests"
        status = 0
        for side, (label, path) in runs.items():
            if args.only and side != args.only:
                continue
            print(f"== {args.suite}'s tests against {label}")
            status |= _pytest(work / side, target, [*path, *deps], extra)
    return 1 if status not in (0, 1) else 0


if __name__ == "__main__":
    sys.exit(main())
