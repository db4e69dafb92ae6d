"""Streaming WebDataset shards from S3 and HTTP: torch_spdl.streaming against webdataset and
litdata, each inside the same training loop.

    .venv/bin/python benchmarks/streaming.py --quick     # 8 shards x 64 small JPEGs, 2 rounds
    .venv/bin/python benchmarks/streaming.py             # 64 shards x 256 JPEGs (320x240), 3
    .venv/bin/python benchmarks/streaming.py --size 16 64 --suites http,cache

The server process (``_streaming_runs.py``) makes the shards (``__key__.jpg`` +
``__key__.cls``) and serves them from moto's S3 and from a plain HTTP server (``Range``,
ETags), both on 127.0.0.1 with 20 ms added to every request (``--latency``), and as files
in a local directory. The suites (``--suites``, all by default):

- ``s3``: ``torch_spdl.DataLoader(StreamingDataset(urls, image_size=(224, 224)),
  batch_size=64, num_workers=2)``, the defaults otherwise (a shuffle buffer of 1000 raw
  samples per worker, decoded after it), against webdataset as its documentation teaches:
  ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode("pil").to_tuple("jpg", "cls")
  .map_tuple(Resize((224, 224)) + PILToTensor, int)`` in torch's ``DataLoader(batch_size=
  64, num_workers=2)``, the objects opened through fsspec (an ``s3`` opener registered in
  ``webdataset.gopen_schemes``: what a user without the aws CLI writes);
- ``http``: the same two over HTTP, webdataset opening the URLs its default way (a
  ``curl`` process per shard);
- ``cache``: torch_spdl with ``cache_dir`` over S3 for two epochs (the first downloads
  into the cache, the second reads it), against torch_spdl on the same shards as local
  files, two epochs;
- ``litdata``: litdata on its own format (``litdata.optimize`` of the same samples, one
  chunk per shard's bytes) on the same S3 server, ``StreamingDataset(shuffle=True,
  cache_dir=...)`` with a torchvision resize to 224x224 as its transform, in its
  ``StreamingDataLoader(batch_size=64, num_workers=2)``, two epochs (its cache keeps the
  chunks), against torch_spdl's cached run above (when litdata is installed).

A data loader is judged inside a training script: every batch goes to the same consumer
(``--consumer``, from ``_consumers.py``): ``train`` (default: a small CNN's forward,
backward and SGD step on the batch's first 32 images cropped to 64x64, in the training
process), ``touch``, ``gpu`` or ``count``. Each run is a fresh process; the runs of a
round go in one order, the next round in the reverse order. Figures are medians (min-max)
over the rounds: samples/s; the first batch (seconds from the loader's construction);
CPU seconds per 1,000 samples of the whole process tree (``getrusage``; it *includes* the
training step) and of the loader alone (less the consumer's CPU); the CPU the rest of the
machine used meanwhile (a shared machine's noise); peak PSS (the ``s3`` suite, one more
run a side, not timed: the sampler costs CPU). ``--out DIR`` writes the tables to
``DIR/streaming.md`` with the command and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SUITES = ("s3", "http", "cache", "litdata")
# name -> (impl, transport, epochs, cache)
RUNS: dict[str, tuple[str, str, int, bool]] = {
    "torch_spdl s3": ("torch_spdl", "s3", 1, False),
    "webdataset s3": ("webdataset", "s3", 1, False),
    "torch_spdl http": ("torch_spdl", "http", 1, False),
    "webdataset http": ("webdataset", "http", 1, False),
    "torch_spdl s3+cache": ("torch_spdl", "s3", 2, True),
    "torch_spdl local": ("torch_spdl", "local", 2, False),
    "litdata s3+cache": ("litdata", "s3", 2, True),
}
SUITE_RUNS = {
    "s3": ["torch_spdl s3", "webdataset s3"],
    "http": ["torch_spdl http", "webdataset http"],
    "cache": ["torch_spdl s3+cache", "torch_spdl local"],
    "litdata": ["litdata s3+cache", "torch_spdl s3+cache"],
}


def _measure(name: str, setup_file: str, args: Any, memory: bool) -> list[dict[str, Any]]:
    """One run in a fresh process; ``memory``: sample its peak PSS (not timed)."""
    from _measure import PeakMemory

    impl, transport, epochs, cache = RUNS[name]
    run = {
        "impl": impl,
        "transport": transport,
        "epochs": epochs,
        "cache": cache,
        "batch": args.batch,
        "workers": args.workers,
        "consumer": args.consumer,
        "state_at": 3,
    }
    cmd = [sys.executable, __file__, "--run", json.dumps(run), "--setup", setup_file]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    sampler = PeakMemory(proc.pid) if memory else None
    with sampler or contextlib.nullcontext():
        out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} run failed (exit {proc.returncode})")
    results: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    for r in results:
        r["peak_mib"] = sampler.peak_kb / 1024 if sampler is not None else None
    return results


def _fmt(values: list[float], digits: int = 0) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _rate(r: dict[str, Any]) -> float:
    return r["samples"] / r["seconds"]


def _cpu(r: dict[str, Any]) -> float:
    return 1000 * r["cpu_s"] / r["samples"]


def _own(r: dict[str, Any]) -> float:
    return 1000 * (r["cpu_s"] - r["consumer_cpu_s"]) / r["samples"]


def _med(runs: list[dict[str, Any]], fn: Any) -> float:
    return statistics.median(fn(r) for r in runs)


HEADER = [
    "| loader | epoch | samples/s | first batch, s | CPU s per 1,000 samples, whole loop "
    "| of which the loader | other processes' CPU, s | peak PSS, MiB | runs |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]


def _row(name: str, epoch: int, runs: list[dict[str, Any]], peaks: list[float]) -> str:
    first = [r["first_s"] for r in runs]
    foreign = [r["foreign_cpu_s"] for r in runs]
    return (
        f"| {name} | {epoch + 1} | {_fmt([_rate(r) for r in runs])} | {_fmt(first, 2)} "
        f"| {_fmt([_cpu(r) for r in runs], 2)} | {_fmt([_own(r) for r in runs], 2)} "
        f"| {_fmt(foreign, 1)} | {_fmt(peaks)} | {len(runs)} |"
    )


def _ratio(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[float, float, float]:
    """a / b: throughput, CPU per sample of the whole loop, of the loader."""
    return (
        _med(a, _rate) / _med(b, _rate),
        _med(a, _cpu) / _med(b, _cpu),
        _med(a, _own) / _med(b, _own),
    )


def _verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def tables(
    results: dict[str, list[list[dict[str, Any]]]], peaks: dict[str, list[float]], suites: list[str]
) -> list[str]:
    """The suites' tables, from each run name's rounds (a list of epochs each)."""

    def epoch(name: str, e: int) -> list[dict[str, Any]]:
        return [rounds[e] for rounds in results.get(name, []) if len(rounds) > e]

    rows: list[str] = []
    for suite in suites:
        names = [n for n in SUITE_RUNS[suite] if results.get(n)]
        if not names:
            continue
        rows += [f"**{suite}**", "", *HEADER]
        for name in names:
            for e in range(RUNS[name][2]):
                rows.append(_row(name, e, epoch(name, e), peaks.get(name, [])))
        rows.append("")
        if suite in ("s3", "http") and len(names) == 2:
            ours, theirs = epoch(names[0], 0), epoch(names[1], 0)
            speed, cpu, own = _ratio(ours, theirs)
            first = _med(ours, lambda r: r["first_s"]) / _med(theirs, lambda r: r["first_s"])
            ok = speed >= 1.5 and cpu <= 1.0
            rows.append(
                f"torch_spdl / webdataset over {suite} (medians): throughput {speed:.2f}x, CPU per "
                f"sample {cpu:.2f}x whole loop ({own:.2f}x the loader), first batch {first:.2f}x "
                f"(targets: >= 1.5x at no more CPU: {_verdict(ok)}; first batch no later: "
                f"{_verdict(first <= 1.0)})"
            )
        if suite == "cache" and len(names) == 2:
            cached, local = epoch(names[0], 1), epoch(names[1], 1)
            warm = _med(cached, _rate) / _med(local, _rate)
            cold = _med(cached, _rate) / _med(epoch(names[0], 0), _rate)
            rows.append(
                f"second epoch from the cache: {warm:.2f}x the local files' second epoch "
                f"(target >= 0.95: {_verdict(warm >= 0.95)}), {cold:.2f}x its own first epoch"
            )
        if suite == "litdata" and len(names) == 2:
            for e in (0, 1):
                speed, cpu, own = _ratio(epoch(names[1], e), epoch(names[0], e))
                rows.append(
                    f"epoch {e + 1}: torch_spdl / litdata throughput {speed:.2f}x, CPU per sample "
                    f"{cpu:.2f}x whole loop ({own:.2f}x the loader) (target >= 1.2x at no "
                    f"more CPU: {_verdict(speed >= 1.2 and cpu <= 1.0)})"
                )
        rows.append("")
    states = [
        r["state_bytes"]
        for rounds in results.values()
        for epochs in rounds
        for r in epochs
        if r.get("state_bytes")
    ]
    if states:
        rows.append(
            f"torch_spdl's resumable state, one worker, after its 4th batch (the shuffle buffer "
            f"filling): {_fmt([s / 1024 for s in states], 1)} KiB pickled"
        )
    return rows


def _server(args: Any, shards: int, per_shard: int, w: int, h: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--serve", *map(str, (shards, per_shard, w, h))]
        + ["--latency", str(args.latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _rounds(args: Any, setup: dict[str, Any], setup_file: Path, names: list[str]) -> Any:
    results: dict[str, list[list[dict[str, Any]]]] = {n: [] for n in names}
    peaks: dict[str, list[float]] = {n: [] for n in names}
    expected = len(setup["s3"]) * args.per_shard
    memory = [n for n in ("torch_spdl s3", "webdataset s3") if n in names and args.memory]
    for r in range(-1, args.repeats):
        order = memory if r < 0 else (names if r % 2 == 0 else names[::-1])
        for name in order:
            out = _measure(name, str(setup_file), args, memory=r < 0)
            for e in out:
                assert e["samples"] == expected and tuple(e["shape"]) == (3, 224, 224), (name, e)
            if r < 0:
                peaks[name].append(out[0]["peak_mib"])
                print(f"  {name}: peak {out[0]['peak_mib']:.0f} MiB (memory run)", flush=True)
                continue
            results[name].append(out)
            line = "; ".join(
                f"epoch {i + 1}: {_rate(e):,.0f} samples/s, first {e['first_s']:.2f} s, "
                f"{_cpu(e):.2f} CPU s/1k ({_own(e):.2f} the loader)"
                for i, e in enumerate(out)
            )
            print(f"  {name}: {line}", flush=True)
    return results, peaks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size", nargs=2, type=int, metavar=("SHARDS", "PER_SHARD"))
    parser.add_argument("--repeats", type=int, default=None, help="rounds")
    parser.add_argument("--suites", default=",".join(SUITES), help=f"of {', '.join(SUITES)}")
    parser.add_argument("--latency", type=float, default=0.02, help="added per request, s")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-memory", dest="memory", action="store_false")
    parser.add_argument(
        "--consumer",
        choices=("train", "touch", "gpu", "count"),
        default="train",
        help="what the training loop does with each batch (train: a CNN step)",
    )
    parser.add_argument(
        "--spdl-kwargs",
        type=json.loads,
        default={},
        help="JSON: StreamingDataset arguments for the torch_spdl side (experiments)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write DIR/streaming.md")
    parser.add_argument("--serve", nargs=4, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    return parser


def _header(args: argparse.Namespace, setup: dict[str, Any], shards: int, w: int, h: int) -> str:
    header = (
        f"{shards} shards x {args.per_shard} JPEG samples ({w}x{h}, "
        f"{setup['bytes'] / 2**20:.0f} MiB) on moto S3 and an HTTP server (127.0.0.1, "
        f"{args.latency * 1000:.0f} ms added per request) and in local files, decoded to "
        f"224x224, batch {args.batch}, {args.workers} workers, {os.cpu_count()} cores, "
        f"consumer {args.consumer}, {args.repeats} rounds"
    )
    if args.spdl_kwargs:
        header += f"; torch_spdl with {json.dumps(args.spdl_kwargs)}"
    return header


def _write_report(out: Path, header: str, rows: list[str]) -> None:
    from _measure import machine

    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    command = " ".join(["python", "benchmarks/streaming.py", *sys.argv[1:]])
    text = [
        f"{header}; {datetime.date.today().isoformat()}.",
        "",
        f"Command: `{command}`; machine: {info['cores']} cores ({info['CPU']}), "
        f"{info['memory']}, torch {info['torch']}, torch_spdl {info['torch_spdl']}.",
        "",
        *rows,
        "",
    ]
    (out / "streaming.md").write_text("\n".join(text))


def main() -> int:
    args = _parser().parse_args()
    from _streaming_runs import run_once, serve

    if args.serve:
        serve(*args.serve, latency=args.latency)
        return 0
    if args.run:
        setup = json.loads(Path(args.setup).read_text())
        print(json.dumps(run_once(setup, json.loads(args.run))))
        return 0

    shards, per_shard, (w, h) = (8, 64, (160, 120)) if args.quick else (64, 256, (320, 240))
    if args.size:
        shards, per_shard = args.size
    args.per_shard = per_shard
    args.repeats = args.repeats or (2 if args.quick else 3)
    suites = [s for s in args.suites.split(",") if s]
    server = _server(args, shards, per_shard, w, h)
    try:
        assert server.stdout is not None
        setup = json.loads(server.stdout.readline())
        if setup["litdata"] is None and "litdata" in suites:
            print("litdata is not installed: its suite is left out", flush=True)
            suites.remove("litdata")
        names = list(dict.fromkeys(n for s in suites for n in SUITE_RUNS[s]))
        setup_file = Path(f"/tmp/torch_spdl_streaming_bench_{os.getpid()}.json")
        setup_file.write_text(json.dumps({**setup, "spdl_kwargs": args.spdl_kwargs}))
        header = _header(args, setup, shards, w, h)
        print(header, flush=True)
        results, peaks = _rounds(args, setup, setup_file, names)
        setup_file.unlink()
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=120)
    rows = tables(results, peaks, suites)
    print("\n".join(rows))
    if args.out is not None:
        _write_report(args.out, header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
