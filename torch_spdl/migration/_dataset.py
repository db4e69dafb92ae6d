"""Map-style Dataset classes: which to split, and the generated staged form.

A class deriving directly from torch's ``Dataset`` whose ``__getitem__`` can be split
(see :mod:`._split`) becomes::

    class Images(StagedDataset, Dataset):
        def __getitem__(self, index):
            return self.process(self.load(index))

        def load(self, index):       # the statements up to the last I/O
            ...
            return img, label

        def process(self, raw):      # the rest, unchanged
            img, label = raw
            ...

``StagedDataset`` comes first among the bases so that the class stays a ``Dataset`` (and
generic subscripts such as ``Dataset[int]`` keep working). ``__getitem__`` keeps its
signature and docstring and composes the two halves, so indexing and torch's DataLoader
behave as before; torch_spdl's DataLoader runs ``load`` and ``process`` as stages with
their own concurrency.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from ._facts import ModuleContext, class_context, module_context
from ._names import ImportMap, walk
from ._report import Decision
from ._split import Refusal, SplitPlan, plan_split
from ._tables import DATASET_BASES, ITERABLE_BASES

__all__ = ["DatasetPlan", "apply_plan", "plan_datasets"]

_STAGED = frozenset({"torch_spdl.StagedDataset", "torch_spdl.data.StagedDataset"})
_RESERVED = ("load", "process", "stages")
_HIJACK = ", and the generated __getitem__ would call the subclass's method"


@dataclass
class DatasetPlan:
    """A class to convert and the split of its ``__getitem__``."""

    split: SplitPlan
    has_docstring: bool
    cut: int  # number of statements (after the docstring) that go to load


def _base_names(cls: cst.ClassDef, imports: ImportMap) -> list[str]:
    out = []
    for arg in cls.bases:
        value = arg.value
        if isinstance(value, cst.Subscript):
            value = value.value
        name = imports.resolve(value)
        if name is not None:
            out.append(name)
    return out


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return {s.name.value: s for s in body if isinstance(s, cst.FunctionDef)}


def _defined(cls: cst.ClassDef) -> set[str]:
    """Names a class body defines: methods and plain assignments (``process = f``)."""
    out = set(_methods(cls))
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                targets = (
                    [t.target for t in small.targets]
                    if isinstance(small, cst.Assign)
                    else [small.target]
                    if isinstance(small, cst.AnnAssign | cst.AugAssign)
                    else []
                )
                out |= {t.value for t in targets if isinstance(t, cst.Name)}
    return out


def _subclasses(classes: list[cst.ClassDef]) -> dict[str, list[cst.ClassDef]]:
    """Class name -> the classes of the module that name it among their bases."""
    out: dict[str, list[cst.ClassDef]] = {}
    for cls in classes:
        for arg in cls.bases:
            value = arg.value.value if isinstance(arg.value, cst.Subscript) else arg.value
            if isinstance(value, cst.Name):
                out.setdefault(value.value, []).append(cls)
    return out


def _overriding_subclass(
    cls: cst.ClassDef, children: dict[str, list[cst.ClassDef]]
) -> tuple[cst.ClassDef, str] | None:
    """A subclass of ``cls`` in the module (at any depth) that overrides ``__getitem__``
    or one of the stage methods, which a split would bypass or hijack."""
    todo, seen = list(children.get(cls.name.value, [])), {id(cls)}
    while todo:
        sub = todo.pop(0)
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        hit = [m for m in ("__getitem__", *_RESERVED) if m in _defined(sub)]
        if hit:
            return sub, hit[0]
        todo += children.get(sub.name.value, [])
    return None


def plan_datasets(
    module: cst.Module,
    imports: ImportMap,
    line_of: Callable[[cst.CSTNode], int],
    decisions: list[Decision],
) -> dict[cst.ClassDef, DatasetPlan]:
    """Plan every Dataset class of the module; record a decision for each."""
    plans: dict[cst.ClassDef, DatasetPlan] = {}
    classes = [n for n in walk(module, into_scopes=True) if isinstance(n, cst.ClassDef)]
    children = _subclasses(classes)
    module_ctx = module_context(module, imports)  # once: shared by every class
    for cls in classes:
        name = cls.name.value
        line = line_of(cls)
        methods = _methods(cls)
        skipped, why = _skipped(name, _base_names(cls, imports), methods)
        if skipped:
            if why is not None:
                decisions.append(Decision(line, "skipped", why, name))
            continue
        fn = methods["__getitem__"]
        result = _split_or_refuse(cls, fn, methods, children, module_ctx, line_of)
        if isinstance(result, Refusal):
            decisions.append(
                Decision(
                    result.line,
                    "kept",
                    f"class {name}: kept one stage (__getitem__ unchanged): {result.reason}",
                    name,
                )
            )
            continue
        decisions += _split_decisions(name, line, result)
        plans[cls] = DatasetPlan(result, result.docstring is not None, len(result.load))
    return plans


def _skipped(
    name: str, bases: list[str], methods: dict[str, cst.FunctionDef]
) -> tuple[bool, str | None]:
    """Whether class ``name`` is left alone before a split is planned, and the reason to
    record (None: none, it is not a dataset)."""
    if any(b in _STAGED for b in bases):
        return True, f"class {name}: already staged"
    if any(b in ITERABLE_BASES for b in bases):
        return True, (
            f"class {name}: an IterableDataset has no __getitem__ to split "
            "(torch_spdl.PipelineDataset runs a staged pipeline as one)"
        )
    if not any(b in DATASET_BASES for b in bases):
        if "__getitem__" in methods and bases:
            return True, (
                f"class {name}: not a direct subclass of torch.utils.data.Dataset "
                f"(bases: {', '.join(bases)}); left alone"
            )
        return True, None
    if "__getitem__" not in methods:
        return True, f"class {name}: defines no __getitem__"
    return False, None


def _split_or_refuse(
    cls: cst.ClassDef,
    fn: cst.FunctionDef,
    methods: dict[str, cst.FunctionDef],
    children: dict[str, list[cst.ClassDef]],
    module_ctx: ModuleContext,
    line_of: Callable[[cst.CSTNode], int],
) -> SplitPlan | Refusal:
    """The split of ``cls``'s ``__getitem__`` (``fn``), or why it stays one stage: the
    names the split adds are taken, a subclass would be run wrong, or ``plan_split``'s
    own reasons."""
    taken = [m for m in _RESERVED if m in methods]
    if taken:
        return Refusal(f"the class already defines {', '.join(taken)}", line_of(fn))
    overriding = _overriding_subclass(cls, children)
    if overriding is not None:
        sub, method = overriding
        return Refusal(
            f"its subclass {sub.name.value} overrides {method} (line {line_of(sub)}): "
            "split, torch_spdl's DataLoader would run this class's "
            f"load and process stages for it{_HIJACK if method != '__getitem__' else ''}",
            line_of(fn),
        )
    return plan_split(fn, class_context(cls, module_ctx), line_of)


def _split_decisions(name: str, line: int, result: SplitPlan) -> list[Decision]:
    """The report's lines for a split of class ``name``: the split, then its notes."""
    passed = ", ".join(result.passed)
    split = Decision(
        line,
        "split",
        f"class {name}: split __getitem__ into 2 stages: load (io, "
        f"{_lines(result.load_lines)}: {', '.join(result.io_labels)}) -> process "
        f"(cpu, {_lines(result.process_lines)}); load passes "
        f"({passed}) to process; __getitem__ now returns "
        f"self.process(self.load({result.index_param.name.value}))",
        name,
        ["load (io)", "process (cpu)"],
    )
    return [split] + [
        Decision(line, "note", f"class {name}: {note}", name) for note in result.notes
    ]


def _lines(span: tuple[int, int]) -> str:
    return f"line {span[0]}" if span[0] == span[1] else f"lines {span[0]}-{span[1]}"


def _docstring(text: str) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Expr(cst.SimpleString(f'"""{text}"""'))])


def _return(names: list[str]) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"return {', '.join(names)}\n")  # type: ignore[return-value]


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    return name


def apply_plan(cls: cst.ClassDef, plan: DatasetPlan) -> cst.ClassDef:
    """The converted class: StagedDataset first among the bases, ``__getitem__`` composing
    the generated ``load`` and ``process`` placed right after it."""
    split = plan.split
    staged = cst.Arg(
        value=cst.Name("StagedDataset"), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    )
    assert isinstance(cls.body, cst.IndentedBlock)
    body: list[cst.BaseStatement] = []
    for stmt in cls.body.body:
        if not (isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__getitem__"):
            body.append(stmt)
            continue
        assert isinstance(stmt.body, cst.IndentedBlock)
        stmts = list(stmt.body.body)
        doc = [stmts.pop(0)] if plan.has_docstring else []
        load_part, process_part = stmts[: plan.cut], stmts[plan.cut :]
        index = split.index_param.name.value
        getitem = stmt.with_changes(
            body=stmt.body.with_changes(
                body=[*doc, cst.parse_statement(f"return self.process(self.load({index}))\n")],
                footer=[],
            )
        )
        load = stmt.with_changes(
            name=cst.Name("load"),
            returns=None,
            leading_lines=[cst.EmptyLine(indent=False)],
            body=stmt.body.with_changes(
                body=[
                    _docstring("The I/O part of ``__getitem__`` (split by torch-spdl migrate)."),
                    *load_part,
                    _return(split.passed),
                ],
                footer=[],
            ),
        )
        used = {n.value for s in process_part for n in walk(s, True) if isinstance(n, cst.Name)}
        proc_doc = _docstring("The CPU part of ``__getitem__`` (split by torch-spdl migrate).")
        if len(split.passed) == 1:
            param = cst.Param(name=cst.Name(split.passed[0]))
            if split.passed[0] == index:
                param = split.index_param.with_changes(comma=cst.MaybeSentinel.DEFAULT)
            head: list[cst.BaseStatement] = [proc_doc]
        else:
            raw = _fresh("raw", used | set(split.passed))
            param = cst.Param(name=cst.Name(raw))
            unpack = cst.parse_statement(f"{', '.join(split.passed)} = {raw}\n")
            head = [proc_doc, unpack]
        self_param = stmt.params.params[0].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
        process = stmt.with_changes(
            name=cst.Name("process"),
            leading_lines=[cst.EmptyLine(indent=False)],
            params=stmt.params.with_changes(params=[self_param, param]),
            body=stmt.body.with_changes(body=[*head, *process_part]),
        )
        body += [getitem, load, process]
    return cls.with_changes(bases=[staged, *cls.bases], body=cls.body.with_changes(body=body))
