"""The benchmark report (benchmarks/run.py) from made-up runs: what it claims and omits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

pytest.importorskip("psutil")
pytest.importorskip("matplotlib")

from _measure import Result, Sample, Spec  # noqa: E402
from _report import write_report  # noqa: E402


def _result(group: str, impl: str, param: int, rates: list[float], **kw: object) -> Result:
    spec = Spec(group, impl, param, "images", tuple(sorted(kw.items())))
    runs = [
        Sample(samples=int(r), seconds=1.0, cpu_s=1.0, peak_mib=300.0, first_batch_s=0.1)
        for r in rates
    ]
    return Result(spec, runs)


def test_report_states_ratios_only_where_measured(tmp_path: Path) -> None:
    results = [
        _result("images-concurrency", "torch", 1, [1000, 1100, 1200]),
        _result("images-concurrency", "torch_spdl", 1, [3000, 3100, 3200]),  # clearly faster
        _result("images-concurrency", "torch", 2, [1000, 1500, 2000]),
        _result("images-concurrency", "torch_spdl", 2, [1800, 1900, 2100]),  # overlaps
        _result("images-concurrency", "torch", 4, [1000, 1000, 1000]),
        Result(Spec("images-concurrency", "torch_spdl", 4, "images"), error="boom"),
    ]
    info = {"cores": "2", "Python": "3.11", "torch": "2.14.1"}
    path = write_report(tmp_path, results, info, quick=True, repeats=3, elapsed_s=1.0)
    text = path.read_text()
    assert path == tmp_path / "REPORT.md"
    assert "| cores | 2 |" in text and "| torch | 2.14.1 |" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line[:4] in "| 1 | 2 | 4 "}
    assert "2.82x" in rows["| 1"] and "torch_spdl better" in rows["| 1"]
    assert "no clear difference" in rows["| 2"]
    assert "not measured" in rows["| 4"] and "not compared" in rows["| 4"]
    assert "3,100 (3,000-3,200)" in rows["| 1"]  # median (min-max)
    assert "## Failed runs" in text and "boom" in text
    for png in ("throughput_vs_concurrency.png", "peak_memory.png", "cpu_utilisation.png"):
        assert (tmp_path / png).stat().st_size > 1000
        assert f"]({png})" in text
