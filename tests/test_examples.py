"""Every example runs in its quick mode and checks its own result (it exits non-zero if not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _sync import CHILD_S

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "script, args, expect",
    [
        ("demo.py", ["--images", "64"], "pipeline  :"),
        ("lightning_image_classification.py", ["--quick"], "every image seen once: OK"),
        ("video_clips.py", ["--quick"], "every clip has the right frames: OK"),
        ("http_async.py", ["--quick"], "every file arrived once, every byte right: OK"),
        ("subprocess_pipeline.py", ["--quick"], "computed in the subprocess: OK"),
        ("migration_before_after.py", ["--quick"], "same batches: OK"),
        ("streaming_s3.py", ["--quick"], "resumed epoch identical: OK"),
        ("ray_workers.py", ["--quick"], "same batches as torch's loader: OK"),
    ],
)
def test_example_runs(script: str, args: list[str], expect: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=CHILD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout, done.stdout[-3000:]
