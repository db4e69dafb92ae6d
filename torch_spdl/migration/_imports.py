"""Adding ``from torch_spdl import ...`` / ``import torch_spdl`` to a module, once."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from ._names import dotted, is_docstring, walk

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


def _imports_module(stmt: cst.CSTNode, module: str) -> bool:
    """Whether ``stmt`` is ``import MODULE`` (among others), binding its top name."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return any(
        isinstance(s, cst.Import)
        and any(dotted(a.name) == module and a.asname is None for a in s.names)
        for s in stmt.body
    )


def _alias(name: str, asname: str | None) -> cst.ImportAlias:
    return cst.ImportAlias(
        name=cst.Name(name), asname=cst.AsName(name=cst.Name(asname)) if asname else None
    )


def _import_line(module: str) -> cst.SimpleStatementLine:
    name = cst.parse_expression(module)
    assert isinstance(name, cst.Name | cst.Attribute)
    return cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(name)])])


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


def _sort_key(pair: tuple[str, str | None]) -> tuple[str, str]:
    """Sort (name, asname) pairs; a missing asname (None) sorts first."""
    return (pair[0], pair[1] or "")


def _imports_torch(stmt: cst.BaseStatement) -> bool:
    """Whether a top-level statement (a ``try``/``if`` block included, not the functions or
    classes it defines) imports ``torch`` or ``torch_spdl`` (or a submodule)."""
    if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
        return False
    for node in walk(stmt):
        if isinstance(node, cst.Import):
            modules = [dotted(a.name) or "" for a in node.names]
        elif isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
            modules = [dotted(node.module) or ""]
        else:
            continue
        if any(m.split(".")[0] in ("torch", "torch_spdl") for m in modules):
            return True
    return False


def _insertion_point(body: Sequence[cst.BaseStatement]) -> int:
    """Where new imports go: at the end of the contiguous block of imports holding the
    module's first top-level import of torch. Every use of what the tool rewrites follows
    that import, and no code runs between it and the new one, so torch (which torch_spdl
    imports) is not imported earlier than the module does (e.g. before environment set-up).
    Without an import of torch: after the docstring and the import block that follows it
    (``__future__`` imports included), before any code."""
    at = next((i + 1 for i, stmt in enumerate(body) if _imports_torch(stmt)), None)
    if at is None:
        at = 1 if body and is_docstring(body[0]) else 0
    while at < len(body) and _is_import_line(body[at]):
        at += 1
    return at


def ensure_imports(
    module: cst.Module,
    names: list[tuple[str, str | None]],
    want_module: bool,
    want_vision: bool = False,
) -> cst.Module:
    """Make ``names`` ((name, asname) pairs) importable from torch_spdl, the module itself
    if ``want_module``, and ``torch_spdl.vision`` if ``want_vision`` (``import
    torch_spdl.vision``, which binds ``torch_spdl`` too). The imports go where
    :func:`_insertion_point` says; an existing ``from torch_spdl import`` line before that
    point is reused."""
    body = list(module.body)
    at = _insertion_point(body)
    names = sorted(set(names), key=_sort_key)
    if names:
        for i, stmt in enumerate(body[:at]):
            node = _from_torch_spdl(stmt)
            if node is None:
                continue
            assert not isinstance(node.names, cst.ImportStar)
            have = {_key(a) for a in node.names}
            extra = [_alias(n, a) for n, a in names if (n, a) not in have]
            if extra:
                merged = list(node.names) + extra
                merged = sorted(merged, key=lambda a: _sort_key(_key(a)))
                merged = _with_commas(merged, keep_last=bool(node.rpar))
                assert isinstance(stmt, cst.SimpleStatementLine)
                body[i] = stmt.with_changes(body=[node.with_changes(names=merged)])
            names = []
            break
    new: list[cst.SimpleStatementLine] = []
    if names:
        aliases = _with_commas([_alias(n, a) for n, a in names], keep_last=False)
        new.append(
            cst.SimpleStatementLine(
                body=[cst.ImportFrom(module=cst.Name("torch_spdl"), names=aliases)]
            )
        )

    def has(name: str) -> bool:
        return any(_imports_module(s, name) for s in body[:at])

    if want_vision and not has("torch_spdl.vision"):
        new.insert(0, _import_line("torch_spdl.vision"))
    elif want_module and not has("torch_spdl") and not has("torch_spdl.vision"):
        new.insert(0, _import_line("torch_spdl"))  # `import torch_spdl.vision` binds it too
    if new:
        if at == 1 and is_docstring(body[0]):
            new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        nxt = body[at] if at < len(body) else None
        if (
            isinstance(nxt, cst.SimpleStatementLine | cst.BaseCompoundStatement)
            and not nxt.leading_lines
            and not _is_import_line(nxt)
        ):  # code right after: a blank line between it and the imports
            body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        body[at:at] = new
    return module.with_changes(body=body)
