"""Every example runs in its quick mode and checks its own result (it exits non-zero if not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "script, args, expect",
    [
        ("demo.py", ["--images", "64"], "pipeline  :"),
        ("lightning_image_classification.py", ["--quick"], "every image seen once: OK"),
    ],
)
def test_example_runs(script: str, args: list[str], expect: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout, done.stdout[-3000:]
