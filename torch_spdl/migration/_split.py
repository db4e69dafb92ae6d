"""Where to split ``__getitem__``: the boundary between its I/O and its CPU work.

The body is cut between two top-level statements, right after the last statement that
does I/O. Everything before goes to ``load``, everything after to ``process``; the local
values that ``process`` reads are passed on as ``load``'s return value. The split is
refused (the class keeps its single ``__getitem__``) when it would change what a sample
is or could depend on timing:

- ``yield``, ``global``/``nonlocal``, a decorated, ``async`` or oddly-shaped ``__getitem__``;
- an early ``return`` before the boundary;
- I/O inside a loop (or comprehension) that also does CPU work;
- draws from a shared random generator anywhere (module-level ``random``/``numpy.random``
  functions, torch's global generator, a generator or random transform kept on ``self``):
  samples run concurrently, so which sample gets which draw would depend on timing;
- an attribute of ``self`` changed on one side of the boundary and used on the other;
- a value that ``process`` needs and that is bound only on some paths before the boundary;
- no I/O recognised, or nothing but I/O (nothing to split).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from ._facts import ClassContext, Facts, function_context, statement_facts
from ._names import is_docstring, walk

__all__ = ["Refusal", "SplitPlan", "plan_split"]

LineOf = Callable[[cst.CSTNode], int]


@dataclass
class SplitPlan:
    """A safe split: the statements of each half and the names passed between them."""

    index_param: cst.Param
    docstring: cst.BaseStatement | None
    load: list[cst.BaseStatement]
    process: list[cst.BaseStatement]
    passed: list[str]
    io_labels: list[str]
    load_lines: tuple[int, int]
    process_lines: tuple[int, int]
    notes: list[str] = field(default_factory=list)


@dataclass
class Refusal:
    """Why ``__getitem__`` stays one stage, and where."""

    reason: str
    line: int


def _signature_problem(fn: cst.FunctionDef) -> str | None:
    if fn.asynchronous is not None:
        return "__getitem__ is async"
    if fn.decorators:
        return "__getitem__ is decorated"
    p = fn.params
    if (
        len(p.params) != 2
        or p.posonly_params
        or p.kwonly_params
        or not isinstance(p.star_arg, cst.MaybeSentinel)
        or p.star_kwarg is not None
    ):
        return "__getitem__ does not take exactly (self, index)"
    if not isinstance(fn.body, cst.IndentedBlock):
        return "__getitem__ is written on one line"
    return None


def plan_split(fn: cst.FunctionDef, ctx: ClassContext, line_of: LineOf) -> SplitPlan | Refusal:
    """Plan the split of ``fn`` (a ``__getitem__``), or say why it stays one stage."""
    problem = _signature_problem(fn)
    if problem is not None:
        return Refusal(problem, line_of(fn))
    assert isinstance(fn.body, cst.IndentedBlock)
    stmts = list(fn.body.body)
    docstring = stmts.pop(0) if stmts and is_docstring(stmts[0]) else None
    if not stmts:
        return Refusal("__getitem__ has no statements", line_of(fn))
    fctx = function_context(fn, ctx)
    facts = [statement_facts(s, fctx) for s in stmts]
    refusal = _body_refusal(fn, stmts, facts, line_of)
    if refusal is not None:
        return refusal
    cut = max(i for i, f in enumerate(facts) if f.io) + 1
    refusal = _cut_refusal(stmts, facts, cut, line_of) or _shared_state(stmts, facts, cut, line_of)
    if refusal is not None:
        return refusal
    index_param = fn.params.params[1]
    passed = _passed(index_param, stmts, facts, cut, line_of)
    if isinstance(passed, Refusal):
        return passed
    io_labels = list(dict.fromkeys(label for f in facts[:cut] for label in f.io))
    return SplitPlan(
        index_param=index_param,
        docstring=docstring,
        load=stmts[:cut],
        process=stmts[cut:],
        passed=passed,
        io_labels=io_labels,
        load_lines=(line_of(stmts[0]), line_of(stmts[cut - 1])),
        process_lines=(line_of(stmts[cut]), line_of(stmts[-1])),
        notes=_notes(stmts, facts, cut, line_of),
    )


def _body_refusal(
    fn: cst.FunctionDef, stmts: list[cst.BaseStatement], facts: list[Facts], line_of: LineOf
) -> Refusal | None:
    """What refuses the body wherever the cut falls: a generator, shared names, no I/O,
    I/O in a loop that also does CPU work."""
    for s, f in zip(stmts, facts, strict=True):
        if f.yields:
            return Refusal("__getitem__ yields (it is a generator)", line_of(s))
        if f.scope_stmts:
            return Refusal(
                "__getitem__ declares global/nonlocal names: state shared across samples",
                line_of(s),
            )
    if not any(f.io for f in facts):
        return Refusal(
            "no I/O recognised in __getitem__ (file, URL, object-store or handle reads); "
            "nothing to split",
            line_of(fn),
        )
    for f in facts:
        if f.mixed_loops:
            return Refusal(
                "I/O inside a loop that also does CPU work: the two cannot be separated",
                line_of(f.mixed_loops[0]),
            )
    return None


def _cut_refusal(
    stmts: list[cst.BaseStatement], facts: list[Facts], cut: int, line_of: LineOf
) -> Refusal | None:
    """What refuses a cut before statement ``cut``: a shared random draw before it,
    nothing after it, an early return before it."""
    for s, f in zip(stmts[:cut], facts[:cut], strict=True):
        if f.shared_rng:
            return Refusal(
                f"draws from a shared random generator ({f.shared_rng[0]}) before the I/O "
                "ends: load runs on threads of the training process, so which sample gets "
                "which draw would depend on timing; move the draw after the reads, or "
                "derive a generator from the index, e.g. numpy.random.default_rng((seed, "
                "index))",
                line_of(s),
            )
    if cut == len(stmts):
        last = stmts[-1]
        what = (
            "the I/O and the CPU work are in the same statement"
            if facts[-1].compute
            else "nothing but I/O follows"
        )
        return Refusal(f"no CPU work after the last I/O ({what}); nothing to split", line_of(last))
    for s, f in zip(stmts[:cut], facts[:cut], strict=True):
        if f.returns:
            return Refusal("early return before the I/O ends", line_of(s))
    return None


def _passed(
    index_param: cst.Param,
    stmts: list[cst.BaseStatement],
    facts: list[Facts],
    cut: int,
    line_of: LineOf,
) -> list[str] | Refusal:
    """The names ``load`` passes to ``process``, in the order ``process`` first uses
    them; a refusal when one is bound only on some paths, or when there is none."""
    bound = [index_param.name.value]
    definite = {index_param.name.value}
    for f in facts[:cut]:
        bound += [n for n in f.store_order if n not in bound]
        definite |= f.definite
    used = set().union(*(f.loads for f in facts[cut:]))
    order = [n.value for s in stmts[cut:] for n in walk(s, True) if isinstance(n, cst.Name)]
    passed = sorted((n for n in bound if n in used), key=order.index)
    for name in passed:
        if name not in definite:
            where = next(s for s, f in zip(stmts, facts, strict=True) if name in f.stores)
            return Refusal(
                f"{name!r} is bound only on some paths before the boundary but used after it",
                line_of(where),
            )
    if not passed:
        return Refusal(
            "the CPU part uses nothing that the I/O part produced; nothing to pass on",
            line_of(stmts[cut]),
        )
    return passed


def _notes(
    stmts: list[cst.BaseStatement], facts: list[Facts], cut: int, line_of: LineOf
) -> list[str]:
    """What the report says about a split that is made: CPU work left in ``load``,
    random draws in ``process``, attributes of ``self`` set in ``load``."""
    notes = []
    for s, f in zip(stmts[:cut], facts[:cut], strict=True):
        if f.io and f.compute:
            notes.append(
                f"line {line_of(s)} mixes I/O and CPU work ({', '.join(f.compute[:3])}): "
                "it stays in load whole"
            )
        elif f.compute and not f.io:
            notes.append(f"line {line_of(s)}: CPU work before the last I/O stays in load")
    for s, f in zip(stmts[cut:], facts[cut:], strict=True):
        if f.shared_rng:
            notes.append(
                f"line {line_of(s)} draws from a shared random generator ({f.shared_rng[0]}) "
                "in process: it runs in the worker processes, seeded and ordered as torch's, "
                "so batches stay torch's with worker_type='process' (the default); "
                "worker_type='thread' would make the draws depend on timing"
            )
    for attr in sorted(set().union(*(f.mutated_attrs for f in facts[:cut]))):
        notes.append(
            f"self.{attr} is assigned in load (e.g. opened lazily): load runs on several "
            "threads sharing self, so they share that object; fine for h5py (it serialises "
            "access), not for a file object read with seek()+read()"
        )
    return notes


def _shared_state(
    stmts: list[cst.BaseStatement], facts: list[Facts], cut: int, line_of: LineOf
) -> Refusal | None:
    """An attribute of ``self`` changed on one side of the boundary, used on the other."""
    load_mut = set().union(*(f.mutated_attrs for f in facts[:cut]))
    load_use = set().union(*(f.read_attrs for f in facts[:cut])) | load_mut
    proc_mut = set().union(*(f.mutated_attrs for f in facts[cut:]))
    proc_use = set().union(*(f.read_attrs for f in facts[cut:])) | proc_mut
    crossing = (load_mut & proc_use) | (proc_mut & load_use)
    if not crossing:
        return None
    attr = sorted(crossing)[0]
    where = next(s for s, f in zip(stmts, facts, strict=True) if attr in f.mutated_attrs)
    return Refusal(
        f"self.{attr} is changed on one side of the I/O/CPU boundary and used on the other: "
        "state shared across the boundary cannot be passed on",
        line_of(where),
    )
