"""Print the import cycles among torch_spdl's modules and among its folders, and the
imports that reach into another package's private module (exit status 1 if there is any).

Every ``import`` and ``from ... import`` in a module counts, wherever it stands: at the
top, inside a function, or under ``if TYPE_CHECKING:``, since a cycle through any of them
still ties the modules together for a reader. A cycle is a strongly connected component
of the module graph with more than one module.

A private subpackage (``torch_spdl/pipeline/_stage_kinds/``) is a folder of its public package,
not a package of its own: its modules may import their siblings' private modules, and the
other packages may not. A package's private modules are shared with its subpackages: a
private module (or private subpackage) directly under ``torch_spdl/``, such as the process
wire ``torch_spdl/_procwire/``, belongs to the parent package, and ``torch_spdl.data`` and
``torch_spdl.pipeline`` may import it; a sibling package's private modules stay out of
reach. Folders are layers, so they import one way too: with each folder
counted as one node (and each module outside a folder as itself), the graph has no cycle
(``pipeline/``'s folders, ``data/``'s, the process wire and the Ray layer alike). And the
files at the top of a package that has folders are its face, the last layer: no module in
one of its folders imports them (``torch_spdl/data/_epoch/`` never imports
``data/_dataloader.py``, nor ``data/__init__.py``), so a folder can be read, and tested,
without the API built on it.

Usage: python scripts/import_cycles.py [package_dir]   (default: torch_spdl/)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(current: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import ``from {'.' * level}{target} import ...``."""
    if level == 0:
        return target or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def build_graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(name, is_package, node.level, node.module)
                # ``from . import x`` may name a submodule; else the module itself
                targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
                targets = targets or [base]
            for target in targets:
                while target and target not in files:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def package_of(root: Path, module: str) -> str:
    """The public package a module belongs to: itself for a package's ``__init__``, else its
    parent, cut before the first private name (``torch_spdl.pipeline._stage_kinds.node`` belongs
    to ``torch_spdl.pipeline``)."""
    path = root.parent.joinpath(*module.split("."))
    parts = module.split(".") if path.is_dir() else module.split(".")[:-1]
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_"):
            return ".".join(parts[:i])
    return ".".join(parts)


def folder_of(root: Path, module: str) -> str:
    """The node a module counts as among folders: the outermost private subpackage it is in
    (``torch_spdl.pipeline._stage_kinds``), else the module itself."""
    parts = module.split(".")
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and root.parent.joinpath(*parts[: i + 1]).is_dir():
            return ".".join(parts[: i + 1])
    return module


def folder_graph(root: Path, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each private subpackage's modules merged into one node."""
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        home = folder_of(root, name)
        there = {folder_of(root, target) for target in targets}
        folders.setdefault(home, set()).update(there - {home})
    return folders


def face_imports(root: Path, graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where a module inside a private folder imports a module
    at the top of the same package: the package's ``__init__`` or one of its files outside
    every folder (its face, which sits on top of its folders)."""

    def in_folder(module: str) -> bool:
        parts = module.split(".")
        return any(
            part.startswith("_") and root.parent.joinpath(*parts[: i + 1]).is_dir()
            for i, part in enumerate(parts[1:], 1)
        )

    found = []
    for name, targets in graph.items():
        if not in_folder(name):
            continue
        home = package_of(root, name)
        for target in targets:
            if package_of(root, target) == home and not in_folder(target):
                found.append((name, target))
    return sorted(found)


def private_crossings(root: Path, graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where a module imports a private module (a name with a
    leading underscore, or anything inside one) of a package other than its own or one of
    its parents (a package's private modules are shared with its subpackages)."""
    found = []
    for name, targets in graph.items():
        home = package_of(root, name)
        for target in targets:
            there = package_of(root, target)
            private = any(part.startswith("_") for part in target.split(".")[1:])
            shared = home == there or home.startswith(there + ".")
            if private and not shared:
                found.append((name, target))
    return sorted(found)


def print_cycles(graph: dict[str, set[str]], label: str) -> list[list[str]]:
    """Print the cycles of ``graph``, each with the imports that close it; return them."""
    cycles = strongly_connected(graph)
    for component in cycles:
        print(f"{label} of {len(component)}: {', '.join(component)}")
        for name in component:
            inside = sorted(t for t in graph[name] if t in component)
            print(f"    {name} -> {', '.join(inside)}")
    return cycles


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent.parent / "torch_spdl")
    graph = build_graph(root.resolve())
    print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} imports")
    cycles = print_cycles(graph, "cycle")
    print(f"{len(cycles)} cycle(s)")
    folder_cycles = print_cycles(folder_graph(root.resolve(), graph), "folder cycle")
    print(f"{len(folder_cycles)} cycle(s) among folders")
    upward = face_imports(root.resolve(), graph)
    for importer, imported in upward:
        print(f"a folder imports its package's face: {importer} -> {imported}")
    print(f"{len(upward)} import(s) of a package's face from one of its folders")
    crossings = private_crossings(root.resolve(), graph)
    for importer, imported in crossings:
        print(f"private import across packages: {importer} -> {imported}")
    print(f"{len(crossings)} import(s) of another package's private module")
    return 1 if cycles or folder_cycles or upward or crossings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
