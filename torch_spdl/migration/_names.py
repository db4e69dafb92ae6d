"""Resolving names through a module's imports: ``Image.open`` -> ``PIL.Image.open``."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

__all__ = ["ImportMap", "dotted", "walk"]


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else ``None``."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _module_name(node: cst.BaseExpression) -> str:
    name = dotted(node)
    assert name is not None
    return name


class ImportMap:
    """Local name -> qualified name, from every ``import`` in a module."""

    def __init__(self, module: cst.Module) -> None:
        self.names: dict[str, str] = {}
        for node in walk(module, into_scopes=True):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = _module_name(alias.name)
                    if alias.asname is not None:
                        self.names[_module_name(alias.asname.name)] = full
                    else:
                        head = full.split(".")[0]
                        self.names[head] = head
            elif isinstance(node, cst.ImportFrom):
                if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
                    continue
                base = _module_name(node.module)
                for alias in node.names:
                    name = _module_name(alias.name)
                    local = _module_name(alias.asname.name) if alias.asname else name
                    self.names[local] = f"{base}.{name}"

    def qualify(self, name: str) -> str:
        head, _, rest = name.partition(".")
        full = self.names.get(head, head)
        return f"{full}.{rest}" if rest else full

    def resolve(self, node: cst.BaseExpression) -> str | None:
        """The qualified name of a name/attribute chain (unimported names stay as they are)."""
        name = dotted(node)
        return None if name is None else self.qualify(name)


_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def walk(node: cst.CSTNode, into_scopes: bool = False) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), depth first in source order; nested
    functions, classes and lambdas are not entered unless ``into_scopes``."""
    yield node
    for child in node.children:
        if not into_scopes and isinstance(child, _SCOPES):
            continue
        yield from walk(child, into_scopes)


def is_docstring(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` is a bare string statement (a docstring where it comes first)."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )
