"""Many Dataset classes in one module: the module-wide facts are found once and shared by
all the classes, and that changes no result.

The module is the one ``benchmarks/migrate_scale.py`` times (the four shapes of class the
tool handles, helpers at module level among them). Each class migrated in that module must
come out exactly as when it is alone in a module of its own: same rewritten text, same
decisions (their line numbers counted from the class's own unit).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

from migrate_scale import HEADER, unit  # noqa: E402

from torch_spdl.migration import FileResult, migrate_source  # noqa: E402

_MARKER = re.compile(r"^# -- unit (\d+)\n", re.M)
_LINES = re.compile(r"\b(lines? )(\d+)(?:-(\d+))?")


def _units(text: str) -> dict[int, tuple[int, str]]:
    """Unit number -> (its first line, its text without the blank lines after it), from
    the marker lines."""
    marks = list(_MARKER.finditer(text))
    out = {}
    for here, after in zip(marks, [*marks[1:], None], strict=True):
        end = len(text) if after is None else after.start()
        line = text.count("\n", 0, here.start()) + 1
        out[int(here.group(1))] = (line, text[here.start() : end].rstrip("\n") + "\n")
    return out


def _decisions(result: FileResult, first: int, last: int) -> list[tuple[object, ...]]:
    """The decisions made within lines ``first``..``last``, their lines counted from
    ``first``."""

    def shift(match: re.Match[str]) -> str:
        span = [int(n) - first for n in match.groups()[1:] if n is not None]
        return match.group(1) + "-".join(map(str, span))

    return [
        (d.line - first, d.kind, _LINES.sub(shift, d.message), d.name, d.stages)
        for d in result.decisions
        if first <= d.line <= last
    ]


def test_each_class_migrates_as_it_would_alone() -> None:
    count = 12  # each shape three times
    source = HEADER + "".join(unit(i) for i in range(count))
    whole = migrate_source(source, "many.py")
    assert whole.status == "changed" and whole.migrated is not None, whole.error
    assert len(whole.splits()) == 9 and len(whole.kept()) == 3
    units, migrated = _units(source), _units(whole.migrated)
    for i in range(count):
        alone_source = HEADER + unit(i)
        alone = migrate_source(alone_source, "one.py")
        assert alone.migrated is not None, alone.error
        assert migrated[i][1] == _units(alone.migrated)[i][1], f"unit {i}"
        (first, text), alone_first = units[i], _units(alone_source)[i][0]
        last, alone_last = first + text.count("\n") - 1, alone_first + text.count("\n") - 1
        decisions = _decisions(alone, alone_first, alone_last)
        assert decisions, f"unit {i}: no decision"
        assert _decisions(whole, first, last) == decisions, f"unit {i}"
