"""The documentation site builds with no warnings, and its API reference is generated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _sync import CHILD_S

DOCS = Path(__file__).resolve().parent.parent / "docs"

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(DOCS),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=CHILD_S,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert "WARNING" not in done.stderr and "ERROR" not in done.stderr, done.stderr[-5000:]
    api = (out / "api.html").read_text()
    for name in (
        "torch_spdl.pipeline.PipelineBuilder.pipe",
        "torch_spdl.pipeline.profile_pipeline",
        "torch_spdl.DataLoader",
        "torch_spdl.source.DistributedRandomSampler",
        "torch_spdl.io.load_video",
        "torch_spdl.lightning.StagedDataModule",
    ):
        assert f'id="{name}"' in api, f"{name} missing from the API reference"
    for image in ("stage_diagram.png", "benchmark_throughput_vs_concurrency.png"):
        assert (out / "_images" / image).exists(), f"{image} not in the built site"
