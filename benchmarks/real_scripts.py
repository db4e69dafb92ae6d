"""Training scripts in the shape of the common public ones, run whole three ways: as
written (torch's DataLoader), with only the import swapped, and after ``torch-spdl migrate
--write``; on local files and on files behind a store that adds latency to every open and
read.

Run: ``python benchmarks/real_scripts.py [--quick] [--repeats N] [--epochs N] [--only
TEXT] [--storage {local,latency,both}] [--retries N]``. Prints Markdown tables and what
migrate reported for each script, and writes them to ``benchmarks/report/real_scripts.md``
(``--no-report``: print only); asserts nothing.

Why: a data loader is judged inside a training script, not alone. The training loop needs
the cores, the GIL, the allocator and the global RNGs, and scripts rely on torch's loader
leaving all of them alone; and the staged form that ``migrate`` writes is the product's
point, so it must pay where users hit I/O. The scripts are programs of their own in
``training_scripts/`` (pytorch/examples' imagenet, also with ``--dummy``; its
super_resolution; a detection script with its own dataset; torchvision's classification
reference with its presets, ``RandomSampler``, ``pin_memory=True`` and ``--device cpu``;
Lightning's ``backbone_image_classifier``), each written the way its public original is,
so that ``migrate`` sees what it would see there; ``_script_sides.py`` writes the three
sides of each (why real files: there). Every run is a fresh ``python`` process (the
interpreter start and imports count in the whole-run time, as a user pays them); the
sides take turns going first; figures are medians of the runs with their spread.

Storage: ``local`` reads the files from the temporary directory; ``latency`` reads them
through ``_latency_fs.py``'s loopback FUSE mount, 5 ms added to every open and every read
inside the filesystem's server (``--delay-ms``): network storage as the scripts meet it,
below their ``open``. Only the scripts that open a file per sample get a latency row
(``dummy`` makes its data, ``lightning`` loads one file at the start).

Each script seeds its RNGs as its original does with ``--seed`` (the classification
reference, which does not, seeds torch) and records its loss after every step: the loss
curves of every run of all three sides must be identical (torch's workers' seeds and order
are part of the contract).

Per script: whole run (process start to exit); the mean time of a training epoch (the
epochs after the first, which includes start-up); peak PSS of the process tree (the
script and its workers, sampled by ``_measure.PeakMemory`` every 0.5 s: reading
``smaps_rollup`` costs about 3 ms of CPU a process, so ``_measure``'s 50 ms would take up
to a fifth of a core from the run it measures); CPU seconds of the training process
during its epochs (its threads included: a staged dataset's load threads run there) and
of the whole tree; on the latency store, the opens and reads the server answered per run;
and whether the run printed torch's ``pin_memory`` warning.

Before the runs, torch_spdl's modules are byte-compiled (``compileall``), as ``pip install``
does for a wheel (a checkout installed editable under ``PYTHONDONTWRITEBYTECODE=1`` would
compile its ~80 modules afresh in every run, about 75 ms no installed user pays). A run
that other processes disturbed is dropped and run again, by ``_measure``'s rule (the
machine's busy CPU during the run, less the run's own and the latency server's, over 5%
of its core-seconds): on a shared 2-core machine one import of torch elsewhere made a run
2 s slower, which five medians do not absorb.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import _script_table
from _latency_fs import LatencyMount
from _measure import (
    FOREIGN_FLOOR_S,
    FOREIGN_LIMIT,
    RETRIES,
    PeakMemory,
    busy_cpu_s,
    cpu_count,
    machine,
)
from _script_data import make_data
from _script_sides import SCRIPTS, SIDES, Script, write_sides

REPORT = Path(__file__).with_name("report") / "real_scripts.md"


class Runner:
    """Runs one side of one script in a fresh process and measures it from outside."""

    def __init__(
        self, sides: Path, data: str, epochs: int, quick: bool, store: LatencyMount | None
    ) -> None:
        self.sides, self.data, self.epochs, self.quick, self.store = (
            sides,
            data,
            epochs,
            quick,
            store,
        )
        self.sample_s, self.retries = 0.5, RETRIES
        self.env = {**os.environ, "PL_USE_MOCKED_MNIST": "1"}  # lightning's MNIST from files

    def _once(self, script: Script, side: str) -> dict:
        argv = script.argv(self.sides / side, self.data, self.epochs, self.quick)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        own0, busy0 = usage.ru_utime + usage.ru_stime, busy_cpu_s()
        server0 = self.store.server_cpu_s() if self.store else 0.0
        io0 = self.store.counts() if self.store else (0, 0)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )
        try:
            with PeakMemory(proc.pid, interval=self.sample_s) as peak:
                out, err = proc.communicate(timeout=900)
        finally:  # interrupted or timed out: the script goes too (its workers follow it)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        tree_cpu = usage.ru_utime + usage.ru_stime - own0  # the script and its reaped workers
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{script.name} ({side}) failed ({proc.returncode}):\n{err[-3000:]}")
        res = json.loads(lines[-1][len("RESULT ") :])
        server = (self.store.server_cpu_s() - server0) if self.store else 0.0
        io = self.store.counts() if self.store else (0, 0)
        res.update(wall_s=wall, tree_cpu_s=tree_cpu, peak_mib=peak.peak_kb / 1024)
        res.update(opens=io[0] - io0[0], reads=io[1] - io0[1], server_cpu_s=server)
        res["foreign_cpu_s"] = max(0.0, busy_cpu_s() - busy0 - tree_cpu - server)
        res["warned"] = "pin_memory" in err
        return res

    def run(self, script: Script, side: str) -> dict:
        """:meth:`_once`, again while other processes took more than ``FOREIGN_LIMIT`` of the
        run's core-seconds (at most ``RETRIES`` times; ``dropped`` counts the runs left)."""
        dropped, res = 0, self._once(script, side)
        limit = max(FOREIGN_FLOOR_S, FOREIGN_LIMIT * res["wall_s"] * cpu_count())
        while res["foreign_cpu_s"] > limit and dropped < self.retries:
            note = f"{script.name} {side}: run again, {res['foreign_cpu_s']:.2f} CPU-s of others"
            print(note, file=sys.stderr)
            dropped += 1
            res = self._once(script, side)
        res["dropped"] = dropped
        return res


def byte_compile_torch_spdl() -> None:
    """Write the ``.pyc`` files of the torch_spdl package the scripts will import, as an
    installed wheel has them (``compileall`` writes even under ``PYTHONDONTWRITEBYTECODE``)."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("torch_spdl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch_spdl is not importable")
    for location in spec.submodule_search_locations:
        compileall.compile_dir(location, quiet=1)


def measure(runner: Runner, scripts: list[Script], repeats: int, storage: str) -> dict:
    """script -> side -> runs, the sides taking turns in first place run after run."""
    results: dict[str, dict[str, list[dict]]] = {}
    for script in scripts:
        results[script.name] = {side: [] for side in SIDES}
        for r in range(repeats):
            order = SIDES[r % 3 :] + SIDES[: r % 3]
            for side in order:
                res = runner.run(script, side)
                results[script.name][side].append(res)
                note = f"{storage} {script.name} {side} run {r + 1}: {res['wall_s']:.2f} s, "
                note += f"epochs {', '.join(f'{s:.2f}' for s in res['epoch_s'])}"
                print(note, file=sys.stderr)
    return results


def _parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 images, 2 epochs (512, 5)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side (5; 2 quick)")
    parser.add_argument("--only", default="", help="only the scripts whose name contains this")
    parser.add_argument("--epochs", type=int, default=None, help="epochs a run (5; 2 quick)")
    parser.add_argument("--storage", choices=("local", "latency", "both"), default="both")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="latency store's delay")
    parser.add_argument(
        "--retries", type=int, default=RETRIES, help=f"runs again of a disturbed run ({RETRIES})"
    )
    parser.add_argument("--no-report", action="store_true", help="print only")
    return parser


def _header(
    argv: list[str],
    args: argparse.Namespace,
    info: dict[str, str],
    repeats: int,
    epochs: int,
    dropped: int,
    elapsed: float,
    torch_version: str,
) -> list[str]:
    """The lines above the tables: the command, the machine, how the runs were made."""
    lines = [f"Command: `python benchmarks/real_scripts.py {' '.join(argv)}`\n"]
    lines += [
        f"Date: {info['date']}; {info['CPU']}, {info['cores']} cores, {info['memory']}; "
        f"{platform.platform()}; Python {info['Python']}, torch {torch_version}, "
        f"torch_spdl {info['torch_spdl']}; load average at start {info['load average at start']}, "
        f"at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n",
        f"{repeats} runs a side, alternated, each a fresh process; {epochs} epochs "
        f"of {256 if args.quick else 512} images; medians (min-max); runs dropped and run again "
        f"because other processes took over {FOREIGN_LIMIT:.0%} of the cores: {dropped}; "
        f"latency store: {args.delay_ms:g} ms added to each open and each read; {elapsed:.0f} s.\n",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount and clean up on kill
    repeats = args.repeats or (2 if args.quick else 5)
    epochs = args.epochs or (2 if args.quick else 5)
    if repeats < 1 or epochs < 2:
        parser.error("--repeats must be at least 1 and --epochs at least 2 (the first is start-up)")
    scripts = [s for s in SCRIPTS if args.only in s.name]
    if not scripts:
        parser.error(
            f"--only {args.only!r} matches no script: {', '.join(s.name for s in SCRIPTS)}"
        )
    storages = ("local", "latency") if args.storage == "both" else (args.storage,)
    import torch

    byte_compile_torch_spdl()
    info, t_all = machine(), time.perf_counter()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="torch_spdl_scripts_") as tmp:
        make_data(Path(tmp, "data"), 256 if args.quick else 512)
        migrated = write_sides(Path(tmp, "sides"))
        for storage in storages:
            chosen = [s for s in scripts if storage == "local" or s.reads_files]
            with ExitStack() as stack:
                store = None
                if storage == "latency":
                    store = stack.enter_context(
                        LatencyMount(Path(tmp, "data"), args.delay_ms / 1000)
                    )
                data = store.path if store else str(Path(tmp, "data"))
                runner = Runner(Path(tmp, "sides"), data, epochs, args.quick, store)
                runner.retries = args.retries
                results[storage] = measure(runner, chosen, repeats, storage)
    elapsed = time.perf_counter() - t_all
    dropped = sum(
        r["dropped"]
        for st in results.values()
        for s in st.values()
        for rs in s.values()
        for r in rs
    )
    lines = _header(argv, args, info, repeats, epochs, dropped, elapsed, torch.__version__)
    made = {s.name: _script_table.did(migrated[s.file]) for s in scripts}
    lines += _script_table.tables(results, made)
    lines += ["", *_script_table.targets(results, made), ""]
    lines += _script_table.migrate_report(migrated, scripts)
    print("\n".join(lines))
    if not args.no_report:
        title = "# Training scripts: torch, the import swapped, `torch-spdl migrate`\n\n"
        REPORT.write_text(title + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
