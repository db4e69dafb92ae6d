"""Print where torch_spdl breaks the house rules on size and naming, and where the benchmark
scripts do (exit status 1 if there is any).

The rules keep every piece small enough for a reader to hold, and every name telling
what it holds (issue 32's acceptance):

- no file in ``torch_spdl/`` over :data:`MAX_FILE_LINES` lines (every line counts);
- no class with more than :data:`MAX_METHODS` methods (the ``def``s in its body,
  properties included, nested classes' not);
- no function over :data:`MAX_CODE_LINES` lines of code: its lines that are neither blank
  nor a comment, from the first statement after its docstring to its end (a nested
  function's lines count in the one around it too). A function that is long for a
  reason says so: the second paragraph of its docstring (the first after the summary
  line's paragraph) starts with :data:`ONE_PIECE` and says why it is one piece;
- no two module names, nor two class names, in ``torch_spdl/`` one edit apart (one
  letter added, removed or changed, leading underscores left out: ``_trace.py`` and
  ``_tracer.py``, ``Decode`` and ``Decoder``): names that close are read as one, yet do
  different jobs. Class names of fewer than :data:`MIN_NAME` letters are left out (``Op``
  and ``Ops`` are not confused);
- no import cycle among the files of ``benchmarks/``, which import each other as
  top-level modules (``from _measure import ...``): a shared piece goes to a module below
  the scripts that use it. Only ``import`` statements count, wherever they stand; a
  module named in a string (``importlib.import_module("_cases")``, how ``_measure.py``
  runs a case in a fresh process) is data, not an import;
- every file of ``benchmarks/`` opens with a module docstring, as the package's modules do;
- the size limits above hold for ``benchmarks/`` too (:func:`benchmark_size_findings`):
  a benchmark is read by whoever checks a figure, so it is held to the package's sizes.

The import graph of ``torch_spdl/`` itself is ``scripts/import_cycles.py``'s.

Usage: python scripts/house_rules.py [repo_root]   (default: this checkout)
"""

from __future__ import annotations

import ast
import itertools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_cycles import strongly_connected  # noqa: E402  (scripts/import_cycles.py)

MAX_FILE_LINES = 450
MAX_METHODS = 15
MAX_CODE_LINES = 60
ONE_PIECE = "One piece:"
MIN_NAME = 4

Function = ast.FunctionDef | ast.AsyncFunctionDef


def one_edit_apart(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter added, removed or changed."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k, (x, y) in enumerate(zip(short, long, strict=False)) if x != y), len(short))
    return short[i:] == long[i + 1 :]


def code_lines(fn: Function, lines: list[str]) -> int:
    """``fn``'s lines of code: neither blank nor a comment, after its docstring."""
    body = fn.body
    if ast.get_docstring(fn, clean=False) is not None:
        body = body[1:]
    if not body:
        return 0
    decorators = getattr(body[0], "decorator_list", [])
    first = min([body[0].lineno, *(d.lineno for d in decorators)])
    assert fn.end_lineno is not None
    return sum(
        1
        for text in lines[first - 1 : fn.end_lineno]
        if text.strip() and not text.strip().startswith("#")
    )


def says_one_piece(fn: Function) -> bool:
    """Whether ``fn``'s docstring says why it is one piece (see the module's notes)."""
    doc = ast.get_docstring(fn) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n") if p.strip()]
    return len(paragraphs) > 1 and paragraphs[1].startswith(ONE_PIECE)


def size_findings(package: Path) -> list[str]:
    """Files, classes and functions over the limits, one line each."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        if len(lines) > MAX_FILE_LINES:
            found.append(f"{path}: {len(lines)} lines (at most {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, Function)]
                if len(methods) > MAX_METHODS:
                    found.append(
                        f"{path}:{node.lineno}: class {node.name} has {len(methods)} "
                        f"methods (at most {MAX_METHODS})"
                    )
            elif isinstance(node, Function):
                n = code_lines(node, lines)
                if n > MAX_CODE_LINES and not says_one_piece(node):
                    found.append(
                        f"{path}:{node.lineno}: {node.name}() has {n} lines of code (at most "
                        f"{MAX_CODE_LINES}, or a docstring paragraph starting {ONE_PIECE!r})"
                    )
    return found


def close_names(package: Path) -> list[str]:
    """Module names and class names one edit apart, one line per pair."""
    modules: dict[str, list[Path]] = {}
    classes: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.stem != "__init__":
            modules.setdefault(path.stem.lstrip("_"), []).append(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and len(node.name.lstrip("_")) >= MIN_NAME:
                classes.setdefault(node.name.lstrip("_"), []).append(f"{path}:{node.lineno}")
    found = []
    for kind, names in (("modules", modules), ("classes", classes)):
        for a, b in itertools.combinations(sorted(names), 2):
            if one_edit_apart(a, b):
                where = ", ".join(str(p) for p in [*names[a], *names[b]])
                found.append(f"{kind} {a!r} and {b!r} are one edit apart ({where})")
    return found


def benchmark_graph(folder: Path) -> dict[str, set[str]]:
    """Which benchmark files import which (each file a top-level module)."""
    files = {p.stem: p for p in sorted(folder.glob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name.partition(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module.partition(".")[0]]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def benchmark_cycles(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    cycles = strongly_connected(benchmark_graph(folder))
    return [f"{folder}: import cycle among {', '.join(sorted(c))}" for c in cycles]


def benchmark_docstrings(folder: Path) -> list[str]:
    """The benchmark files that do not open with a module docstring, one line each."""
    if not folder.is_dir():
        return []
    return [
        f"{path}: no module docstring (say what it measures and why)"
        for path in sorted(folder.glob("*.py"))
        if ast.get_docstring(ast.parse(path.read_text(), str(path))) is None
    ]


def benchmark_size_findings(folder: Path) -> list[str]:
    """The benchmark files, classes and functions over the package's size limits (the
    same rules as :func:`size_findings`, on ``benchmarks/*.py``)."""
    return size_findings(folder) if folder.is_dir() else []


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    os.chdir(root)  # paths in the findings are relative to the checkout
    root = Path(".")
    found = {
        "over the size limits": size_findings(root / "torch_spdl"),
        "names one edit apart": close_names(root / "torch_spdl"),
        "benchmark import cycles": benchmark_cycles(root / "benchmarks"),
        "benchmark files without a module docstring": benchmark_docstrings(root / "benchmarks"),
        "benchmarks over the size limits": benchmark_size_findings(root / "benchmarks"),
    }
    for title, lines in found.items():
        print(f"{len(lines)} {title}")
        for line in lines:
            print(f"  {line}")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
