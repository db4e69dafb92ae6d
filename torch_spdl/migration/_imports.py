"""Adding ``from torch_spdl import ...`` / ``import torch_spdl`` to a module, once."""

from __future__ import annotations

import libcst as cst

from ._names import dotted

__all__ = ["ensure_imports"]


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body
    )


def _from_torch_spdl(stmt: cst.CSTNode) -> cst.ImportFrom | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        node = stmt.body[0]
        if (
            isinstance(node, cst.ImportFrom)
            and not node.relative
            and node.module is not None
            and dotted(node.module) == "torch_spdl"
            and not isinstance(node.names, cst.ImportStar)
        ):
            return node
    return None


def _imports_torch_spdl(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return any(
        isinstance(s, cst.Import)
        and any(dotted(a.name) == "torch_spdl" and a.asname is None for a in s.names)
        for s in stmt.body
    )


def _alias(name: str, asname: str | None) -> cst.ImportAlias:
    return cst.ImportAlias(
        name=cst.Name(name), asname=cst.AsName(name=cst.Name(asname)) if asname else None
    )


def _key(alias: cst.ImportAlias) -> tuple[str, str | None]:
    asname = alias.asname.name if alias.asname else None
    return (dotted(alias.name) or "", dotted(asname) if asname is not None else None)


def _with_commas(aliases: list[cst.ImportAlias], keep_last: bool) -> list[cst.ImportAlias]:
    out = []
    for i, alias in enumerate(aliases):
        if i < len(aliases) - 1:
            if isinstance(alias.comma, cst.MaybeSentinel):
                alias = alias.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
        elif not keep_last:
            alias = alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        out.append(alias)
    return out


def ensure_imports(
    module: cst.Module, names: list[tuple[str, str | None]], want_module: bool
) -> cst.Module:
    """Make ``names`` ((name, asname) pairs) importable from torch_spdl, and the module
    itself if ``want_module``; reuses an existing ``from torch_spdl import`` line."""
    body = list(module.body)
    if names:
        for i, stmt in enumerate(body):
            node = _from_torch_spdl(stmt)
            if node is None:
                continue
            assert not isinstance(node.names, cst.ImportStar)
            have = {_key(a) for a in node.names}
            extra = [_alias(n, a) for n, a in names if (n, a) not in have]
            if extra:
                merged = list(node.names) + extra
                merged = sorted(merged, key=lambda a: _key(a)[0])
                merged = _with_commas(merged, keep_last=bool(node.rpar))
                assert isinstance(stmt, cst.SimpleStatementLine)
                body[i] = stmt.with_changes(body=[node.with_changes(names=merged)])
            names = []
            break
    new: list[cst.SimpleStatementLine] = []
    if names:
        aliases = _with_commas([_alias(n, a) for n, a in sorted(set(names))], keep_last=False)
        new.append(
            cst.SimpleStatementLine(
                body=[cst.ImportFrom(module=cst.Name("torch_spdl"), names=aliases)]
            )
        )
    if want_module and not any(_imports_torch_spdl(s) for s in body):
        new.insert(
            0, cst.SimpleStatementLine(body=[cst.Import(names=[_alias("torch_spdl", None)])])
        )
    if new:
        at = max((i + 1 for i, s in enumerate(body) if _is_import_line(s)), default=0)
        if at == 0 and body and _is_docstring_line(body[0]):
            at = 1
            new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        body[at:at] = new
    return module.with_changes(body=body)


def _is_docstring_line(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )
