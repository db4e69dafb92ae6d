"""Classify what the user passes to ``pipe`` so each stage can run it the cheapest way."""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["OpKind", "classify_op", "op_name", "call_to_list"]


class OpKind(enum.Enum):
    FUNC = "function"
    GEN = "generator"
    ASYNC_FUNC = "async function"
    ASYNC_GEN = "async generator"

    @property
    def is_async(self) -> bool:
        return self in (OpKind.ASYNC_FUNC, OpKind.ASYNC_GEN)


def _unwrap(op: Any) -> Any:
    while isinstance(op, functools.partial):
        op = op.func
    if inspect.isroutine(op) or isinstance(op, type):
        return op
    return type(op).__call__  # a callable object: what matters is its __call__


def classify_op(op: Any) -> tuple[Callable[[Any], Any], OpKind]:
    """Return the callable to invoke and how it produces its outputs.

    Containers with ``__getitem__`` (dict, list, a map-style dataset) are looked up.
    """
    if not callable(op):
        if hasattr(op, "__getitem__"):
            return op.__getitem__, OpKind.FUNC
        raise TypeError(f"pipe() needs a callable or a container with __getitem__, got {op!r}")
    target = _unwrap(op)
    if inspect.isasyncgenfunction(target):
        return op, OpKind.ASYNC_GEN
    if inspect.iscoroutinefunction(target):
        return op, OpKind.ASYNC_FUNC
    if inspect.isgeneratorfunction(target):
        return op, OpKind.GEN
    return op, OpKind.FUNC


def op_name(op: Any) -> str:
    """A readable name for an op: its function name, or its class name."""
    target = op
    while isinstance(target, functools.partial):
        target = target.func
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        name = type(target).__name__
    return name.replace("<locals>.", "")


def call_to_list(op: Callable[[Any], Iterable[Any]], item: Any) -> list[Any]:
    """Run a generator op to the end; used where outputs must cross a process boundary."""
    return list(op(item))
