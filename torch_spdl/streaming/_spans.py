"""What a consumer reads, and the samples a resumable state names, in a compact form.

A consumer's epoch is a list of :class:`Piece` s: whole shards for an epoch begun afresh,
and after a resume on another number of consumers (:mod:`._elastic`) also parts of shards
(the rest of one from a byte on, or a run of samples that were in a shuffle buffer).

A state names the samples of its shuffle buffer by their byte spans, so that a resume can
read them back. Held in a buffer, they form *runs*: samples of one piece with consecutive
numbers, which lie one after the other in the tar (a tar member that is no sample file,
such as a directory, may sit between two of them: the splitter skips it), so one ranged
read of ``[first start, last end)`` brings a run back whole and in order. A run is
``(pos, first index, count, start, end)``; the runs of a state are stored as variable
length integers of their differences from the run before (offsets in 512-byte tar blocks,
which every member starts and ends on), compressed: a buffer of 1,000 samples of 25 KiB
drawn from a dozen shards (about 400 runs) takes about 1.5 KiB, where a list of its
1,000 spans took 18 KiB.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Piece", "Run", "merge_runs", "pack_runs", "runs_of", "unpack_runs"]

Run = tuple[int, int, int, int, int]  # (pos, first index, count, start, end)

_BLOCK = 512


@dataclass(frozen=True)
class Piece:
    """What a consumer reads of one shard: ``url`` from byte ``start`` (a sample's first
    header, the sample numbered ``first_index``) to ``end`` (None: the end of the object)."""

    url: str
    start: int = 0
    end: int | None = None
    first_index: int = 0


def runs_of(spans: Iterable[tuple[int, int, int, int]]) -> list[Run]:
    """The samples ``(pos, index, start, end)`` as runs, in ``(pos, index)`` order."""
    return merge_runs((pos, index, 1, start, end) for pos, index, start, end in spans)


def merge_runs(runs: Iterable[Run]) -> list[Run]:
    """``runs`` (of distinct samples) sorted, those that continue one another made one."""
    merged: list[Run] = []
    for pos, index, count, start, end in sorted(runs):
        if merged:
            p, first, n, lo, _ = merged[-1]
            if p == pos and first + n == index:
                merged[-1] = (p, first, n + count, lo, end)
                continue
        merged.append((pos, index, count, start, end))
    return merged


def _varints(values: Iterable[int], out: bytearray) -> None:
    for value in values:
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)


def pack_runs(runs: Sequence[Run]) -> bytes:
    """``runs`` (sorted, as :func:`runs_of` makes them) as compressed bytes."""
    unit = _BLOCK if all(s % _BLOCK == 0 and e % _BLOCK == 0 for *_, s, e in runs) else 1
    columns: list[list[int]] = [[], [], [], [], []]
    prev_pos = prev_index = prev_end = 0
    for pos, index, count, start, end in runs:
        if pos != prev_pos:
            prev_index = prev_end = 0
        columns[0].append(pos - prev_pos)
        columns[1].append(index - prev_index)
        columns[2].append(count)
        columns[3].append((start - prev_end) // unit)
        columns[4].append((end - start) // unit)
        prev_pos, prev_index, prev_end = pos, index + count, end
    out = bytearray()
    _varints((len(runs), unit), out)
    for column in columns:
        _varints(column, out)
    return zlib.compress(bytes(out))


def unpack_runs(data: bytes) -> list[Run]:
    """What :func:`pack_runs` packed."""
    raw = zlib.decompress(data)
    values: list[int] = []
    value = shift = 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        values.append(value)
        value = shift = 0
    n, unit = values[0], values[1]
    columns = [values[2 + k * n : 2 + (k + 1) * n] for k in range(5)]
    runs: list[Run] = []
    prev_pos = prev_index = prev_end = 0
    for dpos, dindex, count, gap, length in zip(*columns, strict=True):
        pos = prev_pos + dpos
        if pos != prev_pos:
            prev_index = prev_end = 0
        index = prev_index + dindex
        start = prev_end + gap * unit
        end = start + length * unit
        runs.append((pos, index, count, start, end))
        prev_pos, prev_index, prev_end = pos, index + count, end
    return runs
