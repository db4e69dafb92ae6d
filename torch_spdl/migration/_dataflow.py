"""What a statement binds, reads and surely defines: a small dataflow analysis of Python.

The split of ``__getitem__`` (:mod:`._split`) may cut the body only where every name the
second half reads is one the first half surely bound, and must know which attributes of
``self`` each statement reads or changes. Those questions are about Python itself, not
about I/O or datasets, so they live here, apart from the I/O classification
(:mod:`._facts`), and work on any statement: names bound (assignments, ``for``, ``with``,
``except``, imports, ``def``/``class``, the walrus), names read (labels such as attribute
names and keywords are not reads), names surely bound once a statement completes normally
(through ``if``/``else``, ``try``/``except``/``finally`` and ``with``), and ``self``'s
attributes read or mutated (assignment, ``del``, or a mutating method such as ``append``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ._names import walk
from ._tables import MUTATING_METHODS

__all__ = ["Dataflow", "chain_root", "definite_names", "self_attr", "statement_dataflow"]


@dataclass
class Dataflow:
    """What one statement does with names and with ``self``'s attributes."""

    read_attrs: set[str] = field(default_factory=set)  # self.X read
    mutated_attrs: set[str] = field(default_factory=set)  # self.X assigned, deleted, mutated
    stores: set[str] = field(default_factory=set)  # names bound in the function's scope
    store_order: list[str] = field(default_factory=list)  # the same, in binding order
    loads: set[str] = field(default_factory=set)  # names read
    definite: set[str] = field(default_factory=set)  # names surely bound afterwards


def statement_dataflow(stmt: cst.CSTNode) -> Dataflow:
    """The :class:`Dataflow` of one statement (its nested scopes' reads included)."""
    flow = Dataflow()
    _state(stmt, flow)
    _names(stmt, flow)
    flow.definite = definite_names(stmt)
    return flow


# -- expressions -----------------------------------------------------------------------------
def self_attr(node: cst.CSTNode) -> str | None:
    """``X`` for ``self.X``."""
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return node.attr.value
    return None


def chain_root(expr: cst.BaseExpression) -> tuple[str, str] | None:
    """Where a chain of subscripts, attributes and calls starts: ("self", X) or ("name", n)."""
    while True:
        attr = self_attr(expr)
        if attr is not None:
            return ("self", attr)
        if isinstance(expr, cst.Subscript | cst.Attribute):
            expr = expr.value
        elif isinstance(expr, cst.Call):
            expr = expr.func
        elif isinstance(expr, cst.Name):
            return ("name", expr.value)
        else:
            return None


# -- statements ------------------------------------------------------------------------------
def _state(stmt: cst.CSTNode, flow: Dataflow) -> None:
    """Attributes of ``self`` that the statement reads and those it changes."""
    for node in walk(stmt, into_scopes=True):
        attr = self_attr(node)
        if attr is not None:
            flow.read_attrs.add(attr)
        targets: list[cst.CSTNode] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.AnnAssign | cst.AugAssign):
            targets = [node.target]
        elif isinstance(node, cst.Del):
            targets = [node.target]
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in MUTATING_METHODS
        ):
            targets = [node.func.value]
        for target in targets:
            for sub in walk(target):
                root = chain_root(sub) if isinstance(sub, cst.BaseExpression) else None
                if root is not None and root[0] == "self":
                    flow.mutated_attrs.add(root[1])
                    break


def _target_names(target: cst.CSTNode) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, cst.Tuple | cst.List):
        return [n for el in target.elements for n in _target_names(el.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _binders(node: cst.CSTNode) -> list[cst.Name]:
    """Names that ``node`` binds in the function's own scope."""
    if isinstance(node, cst.Assign):
        return [n for t in node.targets for n in _target_names(t.target)]
    if isinstance(node, cst.AnnAssign | cst.AugAssign | cst.For | cst.NamedExpr):
        return _target_names(node.target)
    if isinstance(node, cst.WithItem) and node.asname is not None:
        return _target_names(node.asname.name)
    if isinstance(node, cst.ExceptHandler) and node.name is not None:
        return _target_names(node.name.name)
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        return [node.name]
    if isinstance(node, cst.Import | cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        out = []
        for alias in node.names:
            bound: cst.BaseExpression = alias.asname.name if alias.asname else alias.name
            while isinstance(bound, cst.Attribute):
                bound = bound.value
            if isinstance(bound, cst.Name):
                out.append(bound)
        return out
    return []


def _not_references(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Name nodes under ``node`` that are labels, not variable references."""
    if isinstance(node, cst.Attribute):
        return [node.attr]
    if isinstance(node, cst.Arg) and node.keyword is not None:
        return [node.keyword]
    if isinstance(node, cst.Param):
        return [node.name]
    if isinstance(node, cst.ImportAlias | cst.ImportFrom | cst.Import):
        return list(walk(node))
    if isinstance(node, cst.Global | cst.Nonlocal):
        return list(walk(node))
    return []


def _names(stmt: cst.CSTNode, flow: Dataflow) -> None:
    bound: set[int] = set()
    for node in walk(stmt):
        if isinstance(node, cst.CompFor):
            continue
        for name in _binders(node):
            bound.add(id(name))
            if name.value not in flow.stores:
                flow.stores.add(name.value)
                flow.store_order.append(name.value)
    skip: set[int] = set()
    for node in walk(stmt, into_scopes=True):
        skip.update(id(n) for n in _not_references(node))
    for node in walk(stmt, into_scopes=True):
        if isinstance(node, cst.Name) and id(node) not in skip and id(node) not in bound:
            flow.loads.add(node.value)
    for node in walk(stmt):  # x += 1 reads x too
        if isinstance(node, cst.AugAssign):
            flow.loads.update(n.value for n in _target_names(node.target))


def definite_names(stmt: cst.CSTNode) -> set[str]:
    """Names that are surely bound once ``stmt`` completes normally."""
    if isinstance(stmt, cst.SimpleStatementLine):
        out: set[str] = set()
        for small in stmt.body:
            out.update(n.value for n in _binders(small))
            if isinstance(small, cst.Expr | cst.Assign) and isinstance(
                getattr(small, "value", None), cst.NamedExpr
            ):
                out.update(n.value for n in _binders(small.value))
        return out
    if isinstance(stmt, cst.With):
        out = {n.value for item in stmt.items for n in _binders(item)}
        return out | _block_definite(stmt.body)
    if isinstance(stmt, cst.If):
        if stmt.orelse is None:
            return set()
        other = (
            definite_names(stmt.orelse)
            if isinstance(stmt.orelse, cst.If)
            else _block_definite(stmt.orelse.body)
        )
        return _block_definite(stmt.body) & other
    if isinstance(stmt, cst.Try):
        out = _block_definite(stmt.body)
        for handler in stmt.handlers:
            if not _ends_abruptly(handler.body):
                out &= _block_definite(handler.body)
        if stmt.finalbody is not None:
            out |= _block_definite(stmt.finalbody.body)
        return out
    if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
        return {stmt.name.value}
    return set()


def _block_definite(block: cst.BaseSuite) -> set[str]:
    stmts = block.body if isinstance(block, cst.IndentedBlock) else [block]
    out: set[str] = set()
    for s in stmts:
        out |= definite_names(s)
    return out


def _ends_abruptly(block: cst.BaseSuite) -> bool:
    stmts = list(block.body) if isinstance(block, cst.IndentedBlock) else [block]
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, cst.SimpleStatementLine | cst.SimpleStatementSuite):
        return any(isinstance(s, cst.Raise | cst.Return | cst.Continue) for s in last.body)
    return False
