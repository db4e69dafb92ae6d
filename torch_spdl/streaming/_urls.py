"""Shard lists from URLs: brace ranges, explicit lists and globs, in a stable order.

Training sets in object storage are named by patterns (``s3://bucket/train-{0000..1023}.tar``,
WebDataset's notation) or by a listing. The order of the list is part of the data set's
identity: every rank and worker must see the same list for the shard split and the
seeded shuffle to agree, so a glob is sorted and a pattern is expanded left to right.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["expand_urls", "list_shards"]

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def _expand_one(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> three names; ``{x,y}`` alternatives; left to right."""
    match = _RANGE.search(pattern)
    choice = _CHOICE.search(pattern)
    if match is None and choice is None:
        return [pattern]
    first = min((m for m in (match, choice) if m is not None), key=lambda m: m.start())
    head, tail = pattern[: first.start()], pattern[first.end() :]
    if first is match:
        lo, hi = match.group(1), match.group(2)
        if int(hi) < int(lo):
            raise ValueError(f"empty range {match.group(0)!r} in shard pattern {pattern!r}")
        width = len(lo) if len(lo) == len(hi) else 0
        parts = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        parts = first.group(1).split(",")
    return [name for part in parts for name in _expand_one(head + part + tail)]


def expand_urls(urls: str | Iterable[str]) -> list[str]:
    """The shard URLs named by ``urls``: a string (WebDataset's brace notation,
    ``{000..099}`` ranges and ``{a,b}`` choices; several patterns separated by ``::``) or
    an iterable of such strings, expanded in order.

    Args:
        urls: a pattern or URL, or several.

    Raises:
        ValueError: when the list is empty, or a range is empty.
    """
    items = urls.split("::") if isinstance(urls, str) else list(urls)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"a shard URL must be a string, got {item!r}")
        out.extend(_expand_one(item))
    if not out:
        raise ValueError("no shard URLs given")
    return out


def list_shards(pattern: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The URLs of the objects that match the glob ``pattern`` (``s3://bucket/train-*.tar``),
    sorted, listed once through fsspec.

    Args:
        pattern: a URL with ``*`` / ``?`` / ``[...]`` wildcards.
        storage_options: passed to the fsspec filesystem (``endpoint_url``, credentials).

    Raises:
        FileNotFoundError: when nothing matches.
    """
    import fsspec  # type: ignore[import-untyped]

    fs, path = fsspec.core.url_to_fs(pattern, **dict(storage_options or {}))
    found = sorted(fs.glob(path))
    if not found:
        raise FileNotFoundError(f"no shard matches {pattern!r}")
    protocol = pattern.split("://", 1)[0] if "://" in pattern else None
    if protocol is None:
        return found
    return [p if "://" in p else f"{protocol}://{p}" for p in found]
