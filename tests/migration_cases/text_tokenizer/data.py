"""Test data for the case: a few short text files."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A dog's day: sleep, eat, sleep again.",
    "Foxes are quick; dogs are loyal.",
    "Over the hills and far away, the fox ran.",
    "Lazy afternoons are for dogs and cats alike, and for people too.",
    "Quick!",
    "",
]


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    for i, text in enumerate(TEXTS):
        (root / f"{i:02d}.txt").write_text(text, encoding="utf-8")
    return {"root": str(root)}
