"""``real_scripts.py``'s tables, its verdict on issue 58's targets, and migrate's report
per script, as Markdown lines.

Why apart from the runner: what is measured and how (the runner) changes for other
reasons than how it is shown; and the targets are stated once here, beside the figures
they are read from. A speed-up is torch's median over the side's (above 1.0x: the side is
faster); an epoch's figure is the mean of a run's epochs after the first.
"""

from __future__ import annotations

import hashlib
import json
import statistics

from _script_sides import SIDES, Script


def _epoch(run: dict) -> float:
    return statistics.mean(run["epoch_s"][1:] or run["epoch_s"])


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(_epoch(r) if key == "epoch" else r[key] for r in runs)


def _fmt(runs: list[dict], key: str, digits: int = 2) -> str:
    values = [_epoch(r) if key == "epoch" else r[key] for r in runs]
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _curves(by_side: dict[str, list[dict]]) -> str:
    runs = [r for side in SIDES for r in by_side[side]]
    digests = {hashlib.sha1(json.dumps(r["losses"]).encode()).hexdigest() for r in runs}
    same = "identical" if len(digests) == 1 else f"**{len(digests)} different**"
    return f"{same} ({len(runs[0]['losses'])} steps, {len(runs)} runs)"


def did(lines: list[str]) -> str:
    """What migrate made of a file, in a few words: the classes it split (the script's own,
    or torchvision's folder datasets it staged), else the import."""
    split = []
    for ln in lines:
        if ": split: class " in ln:
            split.append(ln.split("class ", 1)[1].split(":", 1)[0])
        elif ": split: " in ln and " -> torch_spdl.vision." in ln:
            split.append("staged " + ln.split(" -> ", 1)[1].split("(", 1)[0])
    return f"split {', '.join(split)}" if split else "import only (= swap)"


def tables(results: dict[str, dict[str, dict[str, list[dict]]]], made: dict[str, str]) -> list[str]:
    """Epoch time by side, then whole run, memory, CPU and I/O, one row per script and
    storage; ``made``: script -> what migrate made of it (:func:`did`)."""
    speed = [
        "| script | storage | torch epoch, s | swap epoch, s | swap vs torch | migrate epoch, s "
        "| migrate vs torch | migrate vs swap | migrate made | loss curves (all sides) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    cost = [
        "| script | storage | whole run, s: torch / swap / migrate | peak PSS of the tree, MiB: "
        "torch / swap / migrate | training process CPU, s | tree CPU, s | opens + reads a run "
        "| pin_memory warning |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for storage, by_script in results.items():
        for name, by_side in by_script.items():
            t, s, m = (by_side[side] for side in SIDES)
            te, se, me = (_med(x, "epoch") for x in (t, s, m))
            speed.append(
                f"| {name} | {storage} | {_fmt(t, 'epoch')} | {_fmt(s, 'epoch')} | {te / se:.2f}x "
                f"| {_fmt(m, 'epoch')} | {te / me:.2f}x | {se / me:.2f}x | {made[name]} "
                f"| {_curves(by_side)} |"
            )
            walls = " / ".join(f"{_med(x, 'wall_s'):.2f}" for x in (t, s, m))
            pt = _med(t, "peak_mib")
            pss = " / ".join(
                f"{_med(x, 'peak_mib'):.0f}"
                + ("" if x is t else f" ({_med(x, 'peak_mib') / pt - 1:+.1%})")
                for x in (t, s, m)
            )
            cpu = " / ".join(f"{_med(x, 'cpu_s'):.2f}" for x in (t, s, m))
            tree = " / ".join(f"{_med(x, 'tree_cpu_s'):.2f}" for x in (t, s, m))
            io = " / ".join(f"{_med(x, 'opens'):.0f}+{_med(x, 'reads'):.0f}" for x in (t, s, m))
            warned = " / ".join("yes" if all(r["warned"] for r in x) else "no" for x in (t, s, m))
            cost.append(
                f"| {name} | {storage} | {walls} | {pss} | {cpu} | {tree} | "
                f"{io if storage == 'latency' else '-'} | {warned} |"
            )
    return [
        "Epoch time (mean of epochs 2 on):\n",
        *speed,
        "",
        "Whole run, memory, CPU, I/O:\n",
        *cost,
    ]


def targets(
    results: dict[str, dict[str, dict[str, list[dict]]]], made: dict[str, str]
) -> list[str]:
    """Issue 58's acceptance, each met or missed, from the medians above (a migrate column
    missed where migrate only swapped the import says so: the two sides are one program)."""
    rows = [
        (st, n, *(_med(b[side], "epoch") for side in SIDES))
        for st, d in results.items()
        for n, b in d.items()
    ]
    slow_swap = [f"{n} ({st}) {t / s:.2f}x" for st, n, t, s, _ in rows if t / s < 1.0]
    same = {n for n, text in made.items() if text.startswith("import only")}
    slow_mig = [
        f"{n} ({st}) {s / m:.2f}x of swap" + (", the same program" if n in same else "")
        for st, n, _, s, m in rows
        if m > s
    ]
    fast = [f"{n} {t / m:.2f}x" for st, n, t, _, m in rows if st == "latency" and t / m >= 1.3]
    latency = [f"{n} {t / m:.2f}x" for st, n, t, _, m in rows if st == "latency"]
    fat = []
    for st, by_script in results.items():
        for n, b in by_script.items():
            limit = 1.02 * _med(b["torch"], "peak_mib")
            fat += [f"{n} ({st}) {side}" for side in SIDES[1:] if _med(b[side], "peak_mib") > limit]

    def verdict(ok: bool, text: str, misses: list[str]) -> str:
        return f"- {'met' if ok else '**missed**'}: {text}" + (
            f" (missed: {', '.join(misses)})" if misses else ""
        )

    out = ["Targets (issue 58, medians of epoch time and of peak PSS):\n"]
    out.append(verdict(not slow_swap, "every swap column >= 1.0x torch", slow_swap))
    out.append(verdict(not slow_mig, "every migrate column >= the swap column", slow_mig))
    if latency:
        text = "latency store: migrate >= 1.3x torch on at least two scripts"
        text += f" (all: {', '.join(latency)})"
        out.append(verdict(len(fast) >= 2, text, []))
    out.append(verdict(not fat, "peak PSS of the tree <= torch's + 2% on every row", fat))
    return out


def migrate_report(migrated: dict[str, list[str]], scripts: list[Script]) -> list[str]:
    """What ``torch-spdl migrate --write --no-diff`` reported for each script's file."""
    out = [
        "What `torch-spdl migrate --write` reported, by script (`split`: a dataset made two "
        "stages; no `split` line: the import or call rewritten and nothing else):\n"
    ]
    seen: set[str] = set()
    for script in scripts:
        if script.file in seen:
            continue
        seen.add(script.file)
        names = ", ".join(s.name for s in scripts if s.file == script.file)
        lines = migrated.get(script.file) or ["(not run)"]
        out.append(f"- `{script.file}` ({names}): {lines[0]}")
        out += [f"  - {line}" for line in lines[1:]]
    return out
