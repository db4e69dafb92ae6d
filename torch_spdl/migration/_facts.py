"""What one statement of ``__getitem__`` does: I/O, CPU work, randomness, state, names.

The split analysis (:mod:`._split`) works statement by statement on these facts. This
module knows what reading looks like in a dataset: calls are resolved through the module's
imports and compared with the tables in :mod:`._tables`; handles (``self.h5 =
h5py.File(...)``) are followed through assignments, so reading ``self.h5["x"][i]`` counts
as I/O; shared random generators and loops that mix reading with computing are flagged.
Which names and attributes a statement binds, reads and changes is general Python, not
dataset knowledge: that comes from :mod:`._dataflow` and is copied into the facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst

from ._dataflow import chain_root, self_attr, statement_dataflow
from ._names import ImportMap, dotted, walk
from ._tables import (
    HANDLE_OPENERS,
    IO_FUNCTIONS,
    IO_METHODS,
    RNG_CONSTRUCTORS,
    SHARED_RNG_MODULES,
    TORCH_RANDOM,
    TRIVIAL_CALLS,
)

__all__ = [
    "ClassContext",
    "Facts",
    "FunctionContext",
    "ModuleContext",
    "class_context",
    "module_context",
    "statement_facts",
]

_IN_MEMORY = frozenset({"io.BytesIO", "io.StringIO"})
_LOOPS = (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


@dataclass
class ClassContext:
    """What the class around ``__getitem__`` tells about ``self``'s attributes."""

    imports: ImportMap
    io_methods: set[str] = field(default_factory=set)  # methods of the class that read
    io_functions: frozenset[str] = frozenset()  # module functions that read (shared)
    handle_attrs: set[str] = field(default_factory=set)  # self.X: file/HTTP/store handles
    rng_attrs: set[str] = field(default_factory=set)  # self.X: generator objects
    random_attrs: set[str] = field(default_factory=set)  # self.X: random transforms


@dataclass
class FunctionContext:
    """The class context plus what ``__getitem__`` itself binds (handles, generators)."""

    cls: ClassContext
    local_handles: set[str] = field(default_factory=set)
    local_rngs: set[str] = field(default_factory=set)
    in_memory: set[str] = field(default_factory=set)


@dataclass
class Facts:
    """The findings for one statement."""

    io: list[str] = field(default_factory=list)
    compute: list[str] = field(default_factory=list)
    shared_rng: list[str] = field(default_factory=list)
    mixed_loops: list[cst.CSTNode] = field(default_factory=list)
    returns: bool = False
    yields: bool = False
    scope_stmts: bool = False  # global / nonlocal
    mutated_attrs: set[str] = field(default_factory=set)
    read_attrs: set[str] = field(default_factory=set)
    stores: set[str] = field(default_factory=set)
    definite: set[str] = field(default_factory=set)
    loads: set[str] = field(default_factory=set)
    store_order: list[str] = field(default_factory=list)


# -- expressions -----------------------------------------------------------------------------
def _first_arg(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is None and not arg.star:
            return arg.value
    return None


def _opener(call: cst.Call, imports: ImportMap, in_memory: set[str]) -> str | None:
    """The qualified name of a handle-opening call (``None`` for an in-memory buffer)."""
    name = imports.resolve(call.func)
    if name == "numpy.load" and any(
        a.keyword is not None and a.keyword.value == "mmap_mode" for a in call.args
    ):
        return name
    if name in HANDLE_OPENERS and not _is_in_memory(_first_arg(call), imports, in_memory):
        return name
    return None


def _is_in_memory(arg: cst.BaseExpression | None, imports: ImportMap, in_memory: set[str]) -> bool:
    if isinstance(arg, cst.Call):
        return imports.resolve(arg.func) in _IN_MEMORY
    return isinstance(arg, cst.Name) and arg.value in in_memory


def _assignments(
    node: cst.CSTNode, into_scopes: bool = False
) -> Iterable[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(target, value) pairs of every assignment and ``with ... as`` under ``node``."""
    for sub in walk(node, into_scopes):
        if isinstance(sub, cst.Assign):
            for target in sub.targets:
                yield target.target, sub.value
        elif isinstance(sub, cst.AnnAssign) and sub.value is not None:
            yield sub.target, sub.value
        elif isinstance(sub, cst.WithItem) and sub.asname is not None:
            yield sub.asname.name, sub.item


def _is_string_key(value: cst.BaseExpression) -> bool:
    return (
        isinstance(value, cst.Subscript)
        and len(value.slice) == 1
        and isinstance(value.slice[0].slice, cst.Index)
        and isinstance(value.slice[0].slice.value, cst.SimpleString | cst.ConcatenatedString)
    )


def _derives_from(value: cst.BaseExpression, handles: set[str], attrs: set[str]) -> bool:
    """``value`` names a part of a known handle by a string key (``f["images"]``): still a
    handle. (``f["images"][i]`` is data: reading it is the I/O.)"""
    if not _is_string_key(value):
        return False
    root = chain_root(value)
    if root is None:
        return False
    kind, name = root
    return name in (attrs if kind == "self" else handles)


def _is_random_transform(value: cst.CSTNode, imports: ImportMap) -> bool:
    for sub in walk(value, into_scopes=True):
        if isinstance(sub, cst.Call):
            name = imports.resolve(sub.func) or ""
            if name.startswith("torchvision.transforms") and name.rsplit(".", 1)[-1].startswith(
                "Random"
            ):
                return True
    return False


# -- module and class context ----------------------------------------------------------------
@dataclass(frozen=True)
class ModuleContext:
    """What a module tells about its own functions: found once, shared by all its classes."""

    imports: ImportMap
    io_functions: frozenset[str] = frozenset()  # module functions that read


def module_context(module: cst.Module, imports: ImportMap) -> ModuleContext:
    """Which of the module's top-level functions read, directly or through one another.

    Found once per module and shared by every class: analysing the module's functions
    again for each class made the tool's time grow with the square of the module (one
    2,000-line module of 200 Dataset classes took over a minute). A module function's
    facts do not depend on the class that calls it: a parameter it names ``self`` is not
    the class's instance as far as the tool can see, so its ``self.X`` is nobody's handle.
    Each function is read once; a function that calls a reading one reads too, at any
    depth and whatever the order of definition (reachability through the calls between
    them, linear in the calls).
    """
    functions = [s for s in module.body if isinstance(s, cst.FunctionDef)]
    names = {fn.name.value for fn in functions}
    alone = ClassContext(imports)  # outside any class: no handle, generator or method on self
    reads: set[str] = set()
    callers: dict[str, set[str]] = {}
    for fn in functions:
        body = _body(fn)
        fctx = function_context(fn, alone)
        if any(statement_facts(s, fctx).io for s in body):
            reads.add(fn.name.value)
        for callee in _module_calls(body, imports, names):
            callers.setdefault(callee, set()).add(fn.name.value)
    todo = list(reads)
    while todo:
        for caller in callers.get(todo.pop(), ()):
            if caller not in reads:
                reads.add(caller)
                todo.append(caller)
    return ModuleContext(imports, frozenset(reads))


def _module_calls(
    body: list[cst.BaseStatement], imports: ImportMap, names: set[str]
) -> Iterable[str]:
    """The module functions that ``body`` calls, where a call of a reading one would count
    as I/O (:func:`classify_call`: a known reading function's name takes precedence)."""
    for stmt in body:
        for node in walk(stmt):
            if isinstance(node, cst.Call):
                name = imports.resolve(node.func)
                if name in names and name not in IO_FUNCTIONS:
                    yield name


def class_context(cls: cst.ClassDef, module: ModuleContext) -> ClassContext:
    """Scan the class's methods for handles, RNGs and I/O (the module's functions are
    known already: :func:`module_context`)."""
    imports = module.imports
    ctx = ClassContext(imports, io_functions=module.io_functions)
    changed = True
    while changed:  # handles derive from handles: iterate to a fixed point
        changed = False
        for target, value in _assignments(cls, into_scopes=True):
            attr = self_attr(target)
            if attr is None:
                continue
            if attr not in ctx.handle_attrs and (
                (isinstance(value, cst.Call) and _opener(value, imports, set()))
                or _derives_from(value, set(), ctx.handle_attrs)
            ):
                ctx.handle_attrs.add(attr)
                changed = True
    for target, value in _assignments(cls, into_scopes=True):
        attr = self_attr(target)
        if attr is None:
            continue
        if _makes_rng(value, imports):
            ctx.rng_attrs.add(attr)
        if _is_random_transform(value, imports):
            ctx.random_attrs.add(attr)
    # methods that read, to a fixed point (a method calling a method)
    methods = [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]
    changed = True
    while changed:
        changed = False
        for fn in methods:
            name = fn.name.value
            if name in ctx.io_methods or name == "__getitem__":
                continue
            fctx = function_context(fn, ctx)
            if any(statement_facts(s, fctx).io for s in _body(fn)):
                ctx.io_methods.add(name)
                changed = True
    return ctx


def _makes_rng(value: cst.CSTNode, imports: ImportMap) -> bool:
    for sub in walk(value, into_scopes=False):
        if isinstance(sub, cst.Call) and imports.resolve(sub.func) in RNG_CONSTRUCTORS:
            return True
    return False


def _body(fn: cst.FunctionDef) -> list[cst.BaseStatement]:
    body = fn.body
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    small = [stmt for stmt in body.body if isinstance(stmt, cst.BaseSmallStatement)]
    return [cst.SimpleStatementLine(body=small)]


def function_context(fn: cst.FunctionDef, cls: ClassContext) -> FunctionContext:
    """Locals of ``fn`` that hold handles, generators or in-memory buffers."""
    fctx = FunctionContext(cls)
    pairs = list(_assignments(fn.body))
    changed = True
    while changed:
        changed = False
        for target, value in pairs:
            if not isinstance(target, cst.Name):
                continue
            name = target.value
            if isinstance(value, cst.Call) and cls.imports.resolve(value.func) in _IN_MEMORY:
                if name not in fctx.in_memory:
                    fctx.in_memory.add(name)
                    changed = True
            if name not in fctx.local_handles and (
                (isinstance(value, cst.Call) and _opener(value, cls.imports, fctx.in_memory))
                or _derives_from(value, fctx.local_handles, cls.handle_attrs)
            ):
                fctx.local_handles.add(name)
                changed = True
            if _makes_rng(value, cls.imports):
                fctx.local_rngs.add(name)
    return fctx


# -- calls -----------------------------------------------------------------------------------
def classify_call(call: cst.Call, fctx: FunctionContext) -> tuple[str, str]:
    """("io" | "rng" | "compute" | "trivial", label) for one call."""
    ctx = fctx.cls
    imports = ctx.imports
    name = imports.resolve(call.func)
    label = dotted(call.func) or (
        f".{call.func.attr.value}" if isinstance(call.func, cst.Attribute) else "call"
    )
    if name in IO_FUNCTIONS:
        if _is_in_memory(_first_arg(call), imports, fctx.in_memory):
            return "compute", f"{label} (in memory)"
        return "io", name or label
    if name is not None and name in ctx.io_functions:
        return "io", f"{name}() (reads)"
    if isinstance(call.func, cst.Attribute):
        method = call.func.attr.value
        receiver = call.func.value
        if isinstance(receiver, cst.Name) and receiver.value == "self":
            if method in ctx.io_methods:
                return "io", f"self.{method}() (reads)"
            if method in ctx.random_attrs:
                return "rng", f"self.{method} (random transform)"
        root = chain_root(receiver)
        if root is not None:
            kind, owner = root
            if (kind == "self" and owner in ctx.handle_attrs) or (
                kind == "name" and owner in fctx.local_handles
            ):
                return "io", f"{label}() on a handle"
            if kind == "self" and owner in ctx.rng_attrs:
                return "rng", f"{label}() on the shared generator self.{owner}"
        if method in IO_METHODS:
            return "io", f".{method}()"
    attr = self_attr(call.func)
    if attr is not None and attr in ctx.random_attrs:
        return "rng", f"self.{attr}(...) (random transform: torch's global generator)"
    if isinstance(call.func, cst.Call) and _is_random_transform(call.func, imports):
        return "rng", f"{label} (random transform: torch's global generator)"
    if name is not None:
        if name in RNG_CONSTRUCTORS:
            return "trivial", name
        if name.startswith(SHARED_RNG_MODULES):
            return "rng", f"{name} (process-wide generator)"
        if name in TORCH_RANDOM:
            gen = next(
                (a.value for a in call.args if a.keyword and a.keyword.value == "generator"),
                None,
            )
            if gen is None:
                return "rng", f"{name} (torch's global generator)"
            gattr = self_attr(gen)
            if gattr is not None:
                return "rng", f"{name} with the shared generator self.{gattr}"
            return "trivial", name
        if (
            name in TRIVIAL_CALLS
            or name.rsplit(".", 1)[-1] in TRIVIAL_CALLS
            or name.startswith("os.path.")
        ):
            return "trivial", name
    return "compute", label


def _short(node: cst.CSTNode, limit: int = 40) -> str:
    code = cst.Module(body=[]).code_for_node(node)
    return code if len(code) <= limit else code[: limit - 3] + "..."


def _subscript_reads(node: cst.Subscript, fctx: FunctionContext) -> bool:
    """Reading data out of a handle (not naming a part of it by a string key)."""
    if _is_string_key(node):
        return False
    root = chain_root(node.value)
    if root is None:
        return False
    kind, name = root
    if kind == "self":
        return name in fctx.cls.handle_attrs
    return name in fctx.local_handles


# -- statements ------------------------------------------------------------------------------
def statement_facts(stmt: cst.CSTNode, fctx: FunctionContext) -> Facts:
    """Everything the split needs to know about one statement of ``__getitem__``."""
    facts = Facts()
    for node in walk(stmt):
        if isinstance(node, cst.Call):
            kind, label = classify_call(node, fctx)
            if kind == "io":
                facts.io.append(label)
            elif kind == "rng":
                facts.shared_rng.append(label)
            elif kind == "compute":
                facts.compute.append(label)
        elif isinstance(node, cst.Subscript) and _subscript_reads(node, fctx):
            facts.io.append(f"{_short(node.value)}[...] (reads a handle)")
        elif isinstance(node, cst.Return):
            facts.returns = True
        elif isinstance(node, cst.Yield):
            facts.yields = True
        elif isinstance(node, cst.Global | cst.Nonlocal):
            facts.scope_stmts = True
        elif isinstance(node, _LOOPS) and _mixes(node, fctx):
            facts.mixed_loops.append(node)
    flow = statement_dataflow(stmt)
    facts.read_attrs, facts.mutated_attrs = flow.read_attrs, flow.mutated_attrs
    facts.stores, facts.store_order, facts.loads = flow.stores, flow.store_order, flow.loads
    facts.definite = flow.definite
    return facts


def _mixes(loop: cst.CSTNode, fctx: FunctionContext) -> bool:
    kinds = set()
    for node in walk(loop):
        if isinstance(node, cst.Call):
            kinds.add(classify_call(node, fctx)[0])
        elif isinstance(node, cst.Subscript) and _subscript_reads(node, fctx):
            kinds.add("io")
    return "io" in kinds and "compute" in kinds
