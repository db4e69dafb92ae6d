"""The record of what the migration did to each file, and why it left things alone."""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Decision", "FileResult", "render_json", "render_text"]

Kind = Literal["import", "call", "argument", "split", "kept", "note", "library", "skipped"]


@dataclass
class Decision:
    """One decision: a rewrite made, a flag raised, or a place left alone (with why).

    ``kind``: ``import`` / ``call`` (rewritten to torch_spdl), ``argument`` (a DataLoader
    argument whose meaning differs), ``split`` (a Dataset split into stages), ``kept`` (a
    Dataset left as one stage), ``note`` (something to check by hand), ``skipped`` (left
    alone: already migrated or out of scope).
    """

    line: int
    kind: Kind
    message: str
    name: str | None = None  # the class, for split/kept
    stages: list[str] | None = None  # for split: "load (io)", "process (cpu)"


@dataclass
class FileResult:
    """The outcome for one file: ``changed``, ``unchanged`` or ``error`` (left untouched)."""

    path: str
    status: Literal["changed", "unchanged", "error"]
    decisions: list[Decision] = field(default_factory=list)
    error: str | None = None
    original: str | None = None
    migrated: str | None = None
    written: bool = False

    def diff(self) -> str:
        """A unified diff from the original to the migrated text (empty when unchanged)."""
        if self.original is None or self.migrated is None or self.original == self.migrated:
            return ""
        return "".join(
            difflib.unified_diff(
                self.original.splitlines(keepends=True),
                self.migrated.splitlines(keepends=True),
                fromfile=f"a/{self.path}",
                tofile=f"b/{self.path}",
            )
        )

    def splits(self) -> dict[str, list[str]]:
        """Class name -> the stages it was split into."""
        return {
            d.name: d.stages for d in self.decisions if d.kind == "split" and d.name and d.stages
        }

    def kept(self) -> dict[str, str]:
        """Class name -> why it was left as one stage."""
        return {d.name: d.message for d in self.decisions if d.kind == "kept" and d.name}


def render_text(results: list[FileResult]) -> str:
    """The human-readable report: one block per file, one line per decision."""
    lines = []
    for res in results:
        if res.status == "error":
            lines.append(f"{res.path}: error: {res.error} (left untouched)")
            continue
        state = "written" if res.written else res.status
        lines.append(f"{res.path}: {state}")
        for d in sorted(res.decisions, key=lambda d: d.line):
            lines.append(f"  line {d.line}: {d.kind}: {d.message}")
    changed = sum(r.status == "changed" for r in results)
    failed = sum(r.status == "error" for r in results)
    library = sum(d.kind == "library" for r in results for d in r.decisions)
    summary = (
        f"{len(results)} file(s): {changed} to change, {len(results) - changed - failed} "
        f"unchanged, {failed} failed"
    )
    if library:
        summary += (
            f"; {library} loader(s) built inside libraries, out of reach of the swap: "
            "see the 'library' lines for the line that swaps each"
        )
    lines.append(summary)
    return "\n".join(lines) + "\n"


def render_json(results: list[FileResult]) -> str:
    """The report as JSON: a list of files with their status, error and decisions."""
    out: list[dict[str, Any]] = []
    for res in results:
        out.append(
            {
                "path": res.path,
                "status": res.status,
                "written": res.written,
                "error": res.error,
                "decisions": [asdict(d) for d in res.decisions],
            }
        )
    return json.dumps(out, indent=2) + "\n"
