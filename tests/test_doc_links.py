"""Every relative link in the README and the docs resolves: a newcomer who follows one lands
on a file of this checkout (Sphinx checks the docs' cross references; the README is not
part of the Sphinx build, and a Markdown link to a benchmark report or a script is a plain
file path Sphinx does not follow)."""

from __future__ import annotations

import re
from pathlib import Path

from _scripts import ROOT

# [text](target): the target up to a space, a ')' or a '#'; images too (![alt](png))
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _relative_links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text())
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_link_pattern_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("see [the report](gone/REPORT.md#top) and [a site](https://example.org)\n")
    assert _relative_links(page) == ["gone/REPORT.md"]


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in _pages()
        for target in _relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, "links to files that are not there:\n" + "\n".join(broken)
