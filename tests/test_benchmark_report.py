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


def _swap(cell: str, impl: str, workers: int, rates: list[float], peak: float) -> Result:
    spec = Spec("swap", impl, workers, "swap_cell", (("cell", cell), ("impl", impl)), cell)
    runs = [
        Sample(samples=int(r), seconds=1.0, cpu_s=1.0, peak_mib=peak, first_batch_s=0.05)
        for r in rates
    ]
    return Result(spec, runs)


def test_report_has_the_swap_tables_and_plot(tmp_path: Path) -> None:
    results = [
        _swap("images", "torch", 2, [1000, 1100, 1200], 400.0),
        _swap("images", "torch_spdl", 2, [3000, 3100, 3200], 250.0),  # 2.82x, clear
        _swap("sleep-io", "torch", 4, [380, 390, 400], 350.0),
        _swap("sleep-io", "torch_spdl", 4, [390, 395, 420], 200.0),  # 1.01x: spreads overlap
        _swap("sleep-io", "torch_spdl-staged", 4, [500, 520, 540], 200.0),  # 1.33x: 1.5x missed
        _swap("tokenizer", "torch", 2, [9000, 10000, 11000], 350.0),
        _swap("tokenizer", "torch_spdl", 2, [9500, 10500, 12000], 220.0),
        _swap("tokenizer", "torch_spdl-thread", 2, [9500, 9800, 10200], 360.0),
        _swap("images@train", "torch", 2, [500, 510, 520], 400.0),
        _swap("images@train", "torch_spdl", 2, [530, 540, 550], 380.0),  # 1.06x, clear
    ]
    path = write_report(tmp_path, results, {"cores": "2"}, quick=True, repeats=3, elapsed_s=1.0)
    text = path.read_text()
    assert "## Swap the import" in text
    throughput = text.split("### Throughput")[1].split("###")[0]
    rows = [line for line in throughput.splitlines() if "batch" in line]
    speed = {tuple(r.split(" | ")[:2]): r for r in rows}
    images = speed[("| 5. 3x224x224 uint8, batch 128", "2")]
    assert "2.82x" in images and "torch_spdl better" in images and ">= 1.0x: met" in images
    sleep = speed[("| 1. 10 ms blocking I/O, batch 16", "4")]
    assert "no clear difference" in sleep and "met on medians (spreads overlap)" in sleep
    assert sleep.endswith("| 1.03x, ahead in 3 of 3 |")  # 390/380, 395/390, 420/400 in pairs
    tokens = speed[("| 3. pure-Python tokenizer, batch 32", "2")]
    assert tokens.endswith("| 1.06x, ahead in 3 of 3 |")  # pairs 1.056, 1.05, 1.09
    staged = speed[("| 1. 10 ms blocking I/O, batch 16, ours staged as `migrate` splits it", "4")]
    assert ">= 1.5x: **not met**" in staged
    thread = [r for r in rows if "worker_type='thread'" in r]  # the variant has its own row
    assert len(thread) == 1 and "none (an explicit choice)" in thread[0]  # and no target
    trained = speed[("| 5. 3x224x224 uint8, batch 128, consumer train", "2")]
    assert ">= 1.0x: met" in trained
    memory = text.split("### Peak memory")[1].split("##")[0]
    assert "| 5. 3x224x224 uint8, batch 128 | 2 | 400 | 250 | 0.62x | met |" in memory
    assert "| throughput (higher is better) | 6 |" in text  # the summary counts the swap cells
    assert (tmp_path / "swap_ratios.png").stat().st_size > 1000
    assert "](swap_ratios.png)" in text


def _peaks(impl: str, peaks: list[float]) -> Result:
    spec = Spec("swap", impl, 2, "swap_cell", (("cell", "ints"), ("impl", impl)), "ints")
    runs = [Sample(samples=1, seconds=1.0, cpu_s=1.0, peak_mib=p, first_batch_s=0.1) for p in peaks]
    return Result(spec, runs)


def test_swap_memory_verdict_reads_a_bimodal_peak_as_a_tie() -> None:
    from swap import memory_status

    torch_runs = _peaks("torch", [567, 567, 662])  # the two modes of a training process
    assert memory_status(torch_runs, _peaks("torch_spdl", [567, 567, 662])) == "met"
    assert memory_status(torch_runs, _peaks("torch_spdl", [567, 662, 662])).startswith("met: a tie")
    assert memory_status(torch_runs, _peaks("torch_spdl", [700, 710, 720])) == "**not met**"
    assert memory_status(torch_runs, _peaks("torch_spdl", [450, 460, 470])) == "met"


def test_a_peak_says_which_process_and_kind_of_memory_made_it() -> None:
    from _measure import where_text
    from swap import peak_listing, plan

    main = {"Pss": 300 * 1024, "Pss_Anon": 60 * 1024, "Pss_File": 240 * 1024, "Pss_Shmem": 0}
    worker = {"Pss": 80 * 1024, "Pss_Anon": 64 * 1024, "Pss_File": 10 * 1024, "Pss_Shmem": 6144}
    text = where_text([main, worker, worker], 21 * 1024)
    assert text == (
        "main 300 (anon 60, file 240, shmem 0); 2 children 160 (anon 128, file 20, shmem 12); "
        "unmapped shm 21"
    )
    assert where_text([{"Pss": 2048}], 0) == "main 2 (anon 0, file 0, shmem 0); unmapped shm 0"

    torch_r, ours = _peaks("torch", [480]), _peaks("torch_spdl", [530])
    torch_r.memory_runs = [Sample(1, 1.0, 1.0, peak_mib=480, peak_where="main 480")]
    ours.memory_runs = [Sample(1, 1.0, 1.0, peak_mib=530), Sample(1, 1.0, 1.0, peak_mib=529)]
    listing = peak_listing([torch_r, ours])
    assert listing[3:] == [
        "- 6. trivial ints, batch 32, 2 workers, torch: 480 = main 480",
        "- 6. trivial ints, batch 32, 2 workers, torch_spdl: 530 = not recorded",
        "- 6. trivial ints, batch 32, 2 workers, torch_spdl: 529 = not recorded",
    ]

    specs = plan(False, "/nowhere", 8, only="ints", workers=4)
    assert {s.param for s in specs} == {4} and {s.impl for s in specs} == {"torch", "torch_spdl"}


def _peer(workload: str, impl: str, rates: list[float], cpu_s: float = 1.0) -> Result:
    spec = Spec("peers", impl, 0, "peer_case", (("workload", workload),), label=workload)
    runs = [Sample(samples=int(r), seconds=1.0, cpu_s=cpu_s, peak_mib=300.0) for r in rates]
    return Result(spec, runs)


def test_peers_section_judges_each_target_on_medians(tmp_path: Path) -> None:
    import peers

    results = [
        _peer("video", "torch_spdl", [30, 31, 33], cpu_s=0.9),
        _peer("video", "spdl", [20, 21, 22], cpu_s=1.2),  # 1.48x, more CPU: met twice
        _peer("video", "pyav seek", [28, 29, 30], cpu_s=0.8),  # 1.07x, less CPU: not met
        _peer("jpeg", "torch_spdl", [1000, 1010, 1020]),
        _peer("jpeg", "torch_spdl + torchvision", [500, 510, 520]),
        _peer("jpeg", "torch_spdl + torchvision, 1 thread", [950, 960, 970]),  # the best
    ]
    lines = peers.tables(results, ["engine: spdl sync skipped (spdl is not installed)"])
    verdicts = {t: v for t, _, v in peers.targets(results)}
    assert verdicts["video: clips/s >= 1.2x spdl"] == "met"
    assert verdicts["video: CPU per clip < spdl"] == "met"
    assert verdicts["video: clips/s >= 1.2x pyav seek"] == "not met"
    assert verdicts["video: CPU per clip < pyav seek"] == "not met"
    jpeg = "jpeg: >= 1.1x same engine + torchvision (best: torch_spdl + torchvision, 1 thread)"
    assert verdicts[jpeg] == "not met"  # 1.05x the best variant, not 1.98x the worst
    assert verdicts["engine sync: >= 1.2x torchdata (best: -)"] == "-"  # not measured
    text = "\n".join(lines)
    assert "spdl is not installed" in text and "31.0 (30.0-33.0)" in text
    path = write_report(tmp_path, results, {"cores": "2"}, quick=True, repeats=3, elapsed_s=1.0)
    assert "Side by side with the peers" in path.read_text()
    assert (tmp_path / "peers.png").exists()
