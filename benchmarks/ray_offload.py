"""A CPU-starved trainer that hands its JPEG decoding to another node: torch's local workers,
``torch_spdl.DataLoader(worker_type="ray")`` and Ray Data, side by side.

Run, as root (``isolate_network()`` first: Ray sees only loopback): ``python
benchmarks/ray_offload.py [--quick] [--runs N]``. Prints Markdown tables, writes them to
``benchmarks/report/ray_offload.md``; asserts nothing.

Why: Ray workers are for a trainer whose own core is busy with the model, beside spare CPUs
elsewhere. The trainer is pinned to core 0 (one intra-op thread; a 2-layer CNN's forward,
backward and SGD step per batch), a Ray worker node (raylet, workers, object store) to core 1
(started while the main thread's mask is core 1; the head node stays on core 0). ImageFolder
JPEGs of 500x375, ``RandomResizedCrop(224)``, ``RandomHorizontalFlip``, ``ToTensor``,
``Normalize``, batches of 32 (19.3 MB of float32). ``torch``: torch's loader, 2 workers, on
core 0 too (at best a batch costs decode + step); ``torch_spdl-ray``: 2 actors on the worker
node (``resources={"remote": 1}, num_cpus=1``, 2 logical CPUs on its core; at best a batch
costs max(decode, step) plus the hop); ``ray-data``, as a Ray user writes it: ``from_items``
of (path, label), ``map_batches`` of the same decode (same resources), ``iter_torch_batches``.

A run is one shuffled epoch of a fresh loader; runs alternate (the order rotates each round)
on one cluster, idle during torch's. The window opens when batch ``WARM`` arrives (actors up,
Ray Data planned) and closes when batch ``TAIL`` from the end does: the queue as full at both
ends, the workers alive to be read. The machine is shared: a run waits (10 s at most) for a
second in which others take < 10% of the cores (``--retries``: runs again if they took more).

CPU: the process tree's (``psutil``, user + system + reaped children of the trainer, torch's
workers, Ray's GCS, raylets, actors and task workers: all descend from the driver), by the
core a process is pinned to, beside ``/proc/stat``'s busy time of both cores (less ours: the
others' share). Memory: PSS of the trainer and of the tree at the window's ends, outside it
(an ``smaps_rollup`` of a process mapping the object store takes ~40 ms). The hop: an actor on
the worker node returns a prebuilt float32 batch (out of band); the trainer ``ray.get``-s it,
1 and 4 in flight, then through the loader: CPU per batch of the trainer, of the head node's
daemons (its raylet receives, on core 0), of the worker node.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from _measure import machine
from _process_tree import Tree, core_busy, delta

import torch_spdl
from torch_spdl.ray_local import LocalCluster, isolate_network

BATCH, WORKERS, WARM, TAIL, CLASSES = 32, 2, 2, 4, 4
REPORT = Path(__file__).with_name("report") / "ray_offload.md"


def make_jpegs(root: Path, count: int, seed: int = 0) -> None:
    """``count`` photo-like 500x375 JPEGs in ImageFolder layout (as ``real_scripts``'s)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    for i in range(count):
        img = rng.integers(0, 256, 3) + 60 * np.sin(x[..., None] / (7 + i % 11) + y[..., None] / 13)
        img = (img + rng.normal(0, 12, img.shape)).clip(0, 255).astype(np.uint8)
        (root / f"class_{i % CLASSES}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(root / f"class_{i % CLASSES}" / f"{i:05d}.jpg", quality=90)


def transform() -> Any:
    from torchvision import transforms as T  # noqa: N812

    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])


def decode_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """Ray Data's ``map_batches`` function: ImageFolder's PIL loader, the same transforms."""
    from PIL import Image

    tf, images = transform(), []
    for path in batch["path"]:
        with open(path, "rb") as f:
            images.append(tf(Image.open(f).convert("RGB")).numpy())
    return {"image": np.stack(images), "label": batch["label"]}


def make_step() -> Callable[[Any, Any], None]:
    """A training step: a 2-layer CNN's forward, backward and SGD step."""
    from torch import nn

    conv = [nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU()]
    model = nn.Sequential(*conv, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES))
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss()

    def step(x: Any, y: Any) -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def loader(root: str, seed: int, ray: bool) -> Iterator[tuple[Any, Any]]:
    """torch's DataLoader, or torch_spdl's with its workers as actors on the worker node."""
    from torchvision.datasets import ImageFolder

    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": WORKERS}
    kw["generator"] = torch.Generator().manual_seed(seed)
    if not ray:
        # forkserver, not fork: this process is a Ray driver, and torch's forked workers
        # inherit its object-store connection; one of them exiting wrote to it and the
        # head's raylet died ("Invalid Plasma message type", seen once in 15 runs)
        kw["multiprocessing_context"] = "forkserver"
        return iter(torch.utils.data.DataLoader(ImageFolder(root, transform()), **kw))
    options = {"resources": {"remote": 1}, "num_cpus": 1}
    dataset = ImageFolder(root, transform())
    return iter(torch_spdl.DataLoader(dataset, worker_type="ray", ray_options=options, **kw))


def _has_ray_data() -> bool:
    """Whether Ray Data imports here (``ray[data]``: pandas and pyarrow); says so if not."""
    if find_spec("pyarrow") and find_spec("pandas"):
        return True
    print(
        "ray-data not measured: Ray Data needs ray[data] (pandas, pyarrow): "
        "pip install -e '.[bench]'",
        file=sys.stderr,
    )
    return False


def ray_data(root: str, seed: int) -> Iterator[tuple[Any, Any]]:
    import ray
    from torchvision.datasets import ImageFolder

    ray.data.DataContext.get_current().enable_progress_bars = False
    items = [{"path": p, "label": c} for p, c in ImageFolder(root).samples]
    random.Random(seed).shuffle(items)
    ds = ray.data.from_items(items)
    ds = ds.map_batches(decode_batch, batch_size=BATCH, num_cpus=1, resources={"remote": 1})
    return ((b["image"], b["label"]) for b in ds.iter_torch_batches(batch_size=BATCH))


CONTENDERS: dict[str, Callable[[str, int], Iterator[tuple[Any, Any]]]] = {
    "torch": lambda root, seed: loader(root, seed, ray=False),
    "torch_spdl-ray": lambda root, seed: loader(root, seed, ray=True),
    "ray-data": ray_data,
}


def run_one(name: str, root: str, batches: int, seed: int, tree: Tree) -> dict[str, Any]:
    """One epoch of ``name`` with a training step per batch; the window's figures."""
    torch.manual_seed(seed)
    step, pss, marks, first_s, where = make_step(), [], [], 0.0, "-"
    t_start, samples = time.perf_counter(), 0
    it = CONTENDERS[name](root, seed)
    for i in range(batches):
        x, y = next(it)
        first_s = time.perf_counter() - t_start if i == 0 else first_s
        if i == WARM:  # the window's ends; memory outside it
            pss.append(tree.pss_mib())
        if i in (WARM, batches - TAIL):
            marks.append((time.perf_counter(), tree.snapshot(), core_busy()))
        if i == batches - TAIL:
            pss.append(tree.pss_mib())
        samples += len(y) if WARM <= i < batches - TAIL else 0
        step(x, y)
        where = tree.where() if i == WARM + 1 else where
    rest = sum(1 for _ in it)  # the epoch's end: the loader stops its workers
    assert rest == 0, f"{name}: {rest} batches more than {batches}"
    del it
    (t0, cpu0, busy0), (t1, cpu1, busy1) = marks
    seconds, cpu, busy = t1 - t0, delta(cpu0, cpu1), busy1 - busy0
    out = {"rate": samples / seconds, "first_s": first_s, "samples": samples, "cpu": cpu}
    out |= {"busy": busy, "foreign": max(0.0, busy - sum(cpu.values())) / (2 * seconds)}
    out |= {
        "where": where,
        "pss_trainer": max(p[0] for p in pss),
        "pss_tree": max(p[1] for p in pss),
    }
    return out


class HopActor:
    def __init__(self) -> None:
        self.batch = np.random.default_rng(0).standard_normal((BATCH, 3, 224, 224), np.float32)

    def get(self) -> Any:
        return self.batch


class PrebuiltBatches(list):
    """``n`` items, each the same 32x3x224x224 tensor (made in the worker, at its first)."""

    def __getitem__(self, i: Any) -> Any:
        if not hasattr(self, "batch"):
            self.batch = torch.randn(BATCH, 3, 224, 224)
        return self.batch


def hop(tree: Tree, n: int) -> list[dict[str, Any]]:
    import ray

    opts, out = {"resources": {"remote": 1}, "num_cpus": 1}, []
    actors = [ray.remote(HopActor).options(**opts).remote() for _ in range(WORKERS)]

    def measure(label: str, batches: Iterator[Any]) -> None:
        for _ in range(WARM + 2):
            next(batches)
        t0, cpu0 = time.perf_counter(), tree.snapshot()
        nbytes = sum(b.nbytes for b in (next(batches) for _ in range(n)))
        seconds, cpu1 = time.perf_counter() - t0, tree.snapshot()
        cpu, by = delta(cpu0, cpu1), delta(cpu0, cpu1, by=2)
        core0 = sum(v for k, v in cpu.items() if k.startswith("ray@0"))
        core1 = sum(v for k, v in cpu.items() if k.endswith("@1"))
        ranked = sorted(by.items(), key=lambda kv: -kv[1])[:4]
        top = ", ".join(f"{t} {1e3 * v / n:.1f}" for t, v in ranked)
        row = {"label": label, "us_trainer": 1e6 * cpu.get("trainer@0", 0.0) / n, "top": top}
        row |= {"us_head": 1e6 * core0 / n, "us_worker": 1e6 * core1 / n}
        out.append({**row, "wall_ms": 1e3 * seconds / n, "mb_s": nbytes / seconds / 1e6})

    def raw(depth: int) -> Iterator[Any]:
        refs = [actors[i % WORKERS].get.remote() for i in range(depth)]
        for i in range(depth, 10**9):
            batch = ray.get(refs.pop(0))
            refs.append(actors[i % WORKERS].get.remote())
            yield batch

    measure("ray.get, 1 in flight", raw(1))
    measure("ray.get, 4 in flight (2 actors)", raw(4))
    for a in actors:
        ray.kill(a)
    data = PrebuiltBatches(range(n + WARM + 2))
    kw = {"batch_size": None, "num_workers": WORKERS, "worker_type": "ray", "ray_options": opts}
    it = iter(torch_spdl.DataLoader(data, **kw))
    measure("torch_spdl.DataLoader, 2 actors, prefetch 2", it)
    del it
    return out


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, mid, hi = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} ({lo}-{hi})"


def per_sample(r: dict, keep: Callable[[str], bool]) -> float:
    return 1e3 * sum(v for k, v in r["cpu"].items() if keep(k)) / r["samples"]


def counted(name: str) -> Callable[[str], bool]:
    """The processes a contender's CPU counts: torch's leaves out Ray's idle cluster."""
    return (lambda k: not k.startswith("ray")) if name == "torch" else (lambda k: True)


HEAD = (
    "| contender | samples/s | vs torch | first batch, s | CPU ms/sample, tree | of it core 0 "
    "| of it core 1 | /proc/stat cores 0+1, ms/sample | others' share | trainer peak PSS, MiB "
    "| tree PSS, MiB |\n|---" + "|---:" * 10 + "|"
)
HOP_HEAD = (
    "| the hop, per 32x3x224x224 float32 batch (19.3 MB) | trainer CPU, us | head node's Ray "
    "daemons (core 0), us | worker node (core 1), us | wall, ms | MB/s | most CPU, ms a batch |"
    "\n|---" + "|---:" * 5 + "|---|"
)


def tables(results: dict[str, list[dict]], hops: list[dict]) -> list[str]:
    med, out = {k: statistics.median(r["rate"] for r in v) for k, v in results.items()}, [HEAD]
    for name, runs in results.items():
        u = counted(name)
        cols = [[per_sample(r, u) for r in runs], [1e3 * r["busy"] / r["samples"] for r in runs]]
        for core in ("@0", "@1"):
            cols.insert(
                -1, [per_sample(r, lambda k, c=core, u=u: u(k) and k.endswith(c)) for r in runs]
            )
        cells = [spread([r["rate"] for r in runs], "{:.1f}"), f"{med[name] / med['torch']:.2f}x"]
        cells += [spread([r["first_s"] for r in runs]), *map(spread, cols)]
        cells += [spread([100 * r["foreign"] for r in runs], "{:.0f}%")]
        cells += [spread([r[k] for r in runs], "{:.0f}") for k in ("pss_trainer", "pss_tree")]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    torch_runs = results["torch"]
    idle = spread([per_sample(r, lambda k: k.startswith("ray")) for r in torch_runs])
    d = BATCH * statistics.median(per_sample(r, lambda k: k == "local@0") for r in torch_runs)
    t = BATCH * statistics.median(per_sample(r, lambda k: k == "trainer@0") for r in torch_runs)
    out.append(
        f"\nRay's idle cluster during torch's runs (left out of its row): {idle} CPU ms/sample. "
        f"In torch's runs a batch took {d:.0f} ms of its workers (decode, augment, collate) and "
        f"{t:.0f} ms of the trainer (the step, taking the batch): at best torch_spdl-ray / torch "
        f"= (d + t) / max(d, t) = {(d + t) / max(d, t):.2f}x, with a free hop.\n"
    )
    out.append(HOP_HEAD)
    for h in hops:
        row = f"| {h['label']} | {h['us_trainer']:.0f} | {h['us_head']:.0f} | {h['us_worker']:.0f}"
        out.append(f"{row} | {h['wall_ms']:.2f} | {h['mb_s']:.0f} | {h['top']} |")
    return out


def targets(results: dict[str, list[dict]]) -> list[str]:
    rate = {n: statistics.median(r["rate"] for r in rs) for n, rs in results.items()}
    cpu = {n: statistics.median(per_sample(r, counted(n)) for r in rs) for n, rs in results.items()}
    ratio = rate["torch_spdl-ray"] / rate["torch"]
    out = [f"- torch_spdl-ray >= 1.6x torch: {ratio:.2f}x, {'met' if ratio >= 1.6 else 'missed'}"]
    if "ray-data" in results:
        ratio, ours = rate["torch_spdl-ray"] / rate["ray-data"], cpu["torch_spdl-ray"]
        theirs = cpu["ray-data"]
        ok = "met" if ratio >= 1.2 and ours <= theirs else "missed"
        out += [f"- torch_spdl-ray >= 1.2x ray-data at no more CPU per sample: {ratio:.2f}x, "]
        out[-1] += f"{ours:.2f} vs {theirs:.2f} CPU ms/sample: {ok}"
    return out


def quiet(tree: Tree, wait_s: float) -> float:
    """Wait (``wait_s`` at most) for a second in which others take < 10% of the cores."""
    deadline, share = time.monotonic() + wait_s, 1.0
    while share >= 0.1 and time.monotonic() < deadline:
        c0, b0 = tree.snapshot(), core_busy()
        time.sleep(1.0)
        share = max(0.0, core_busy() - b0 - sum(delta(c0, tree.snapshot()).values())) / 2
    return share


def measure(args: argparse.Namespace, root: str, images: int) -> tuple[dict, list, str]:
    # the head (and the driver) on core 0; the worker node on core 1, by this thread's mask
    cluster = LocalCluster(worker_nodes=0, object_store_mb=1024)
    session = os.path.basename(cluster.cluster.head_node.get_session_dir_path())
    try:
        os.sched_setaffinity(0, {1})
        cluster.add_node(2)
        os.sched_setaffinity(0, {0})
        cluster.cluster.wait_for_nodes()
        tree = Tree({p.pid for p in psutil.Process().children()})  # all Ray's, so far
        contenders = [c for c in CONTENDERS if c != "ray-data" or _has_ray_data()]
        results: dict[str, list[dict]] = {c: [] for c in contenders}
        for r in range(args.runs):
            for name in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:
                for tries in range(1, 2 + args.retries):  # noqa: B007 (kept below)
                    before = quiet(tree, 3 if args.quick else 10)
                    res = run_one(name, root, images // BATCH, seed=r, tree=tree)
                    cpu = {k: round(v, 2) for k, v in res["cpu"].items()}
                    note = f"{res['rate']:.1f} samples/s, first batch {res['first_s']:.2f} s"
                    note += f", others {100 * before:.0f}% before, {100 * res['foreign']:.0f}%"
                    note += f" during; {res['where']}; CPU s {cpu}"
                    print(f"{r + 1} {name}: {note}", file=sys.stderr)
                    if res["foreign"] < 0.1:
                        break
                results[name].append({**res, "tries": tries})
        hops = hop(tree, 50 if args.quick else 200)
    finally:
        cluster.shutdown()
    time.sleep(2.0)
    procs = psutil.process_iter(["cmdline"])
    left = sum(session in " ".join(p.info["cmdline"] or []) for p in procs)
    return results, hops, f"processes of Ray session {session} left after shutdown: {left}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    isolate_network()  # first: nothing Ray starts may see an address but loopback
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run each, 384 images")
    parser.add_argument("--runs", type=int, default=None, help="runs per contender (3; 1 quick)")
    parser.add_argument("--retries", type=int, default=0, help="runs again a disturbed run")
    parser.add_argument("--no-report", action="store_true", help="print only")
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    images = 384 if args.quick else 1024
    os.sched_setaffinity(0, {0})
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    import ray

    torch.set_num_threads(1)
    t_all, m = time.perf_counter(), machine()
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="ray_offload_") as tmp:
        make_jpegs(Path(tmp, "train"), images)
        results, hops, left = measure(args, str(Path(tmp, "train")), images)
    again = sum(r["tries"] - 1 for rs in results.values() for r in rs)
    lines = [f"Command: `python benchmarks/ray_offload.py {' '.join(argv)}`\n"]
    lines += [f"Date: {date}; {m['CPU']}, {m['cores']} cores, {m['memory']}; {platform.platform()}"]
    lines[-1] += f"; Python {platform.python_version()}, torch {torch.__version__}, ray "
    lines[-1] += f"{ray.__version__}, torch_spdl {m['torch_spdl']}; load average at start "
    lines[-1] += f"{m['load average at start']}\n"
    lines += [f"{args.runs} runs per contender, alternated; {images} JPEGs of 500x375, "]
    lines[-1] += f"{images // BATCH} batches of {BATCH} an epoch, timed from batch {WARM} to "
    lines[-1] += f"{images // BATCH - TAIL}; medians (min-max); runs taken again because others "
    lines[-1] += f"took >10% of the cores: {again}.\n"
    lines += [*tables(results, hops), "", *targets(results), ""]
    lines += ["Where Ray's actors and tasks ran (pid, `os.sched_getaffinity`; last run of each):\n"]
    lines += [f"- {name}: {res[-1]['where']}" for name, res in results.items()]
    lines += ["", f"Whole benchmark: {time.perf_counter() - t_all:.0f} s; {left}."]
    print("\n".join(lines))
    if not args.no_report:
        title = "# Ray offload: a CPU-starved trainer, its decoding on another node\n\n"
        REPORT.write_text(title + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
