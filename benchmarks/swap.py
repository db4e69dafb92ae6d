"""Swap the import: one training-loop script, run with torch's DataLoader and with ours.

Run: ``python benchmarks/swap.py [--quick] [--repeats N] [--only TEXT] [--workers N]
[--peaks]``. Prints Markdown tables; asserts nothing. ``benchmarks/run.py`` runs the same
cells for its report.

Why: ``torch_spdl.DataLoader`` claims to be a drop-in for ``torch.utils.data.DataLoader``.
The other benchmarks give each side its best knobs; this one changes *only the import*.
``train_loop`` below is written once and receives the DataLoader class (torch's, or
``from torch_spdl import DataLoader``); it passes ``dataset, batch_size, num_workers`` (and
``shuffle=True`` where a training run would) and nothing else, so every other argument is
each side's default. A user who swaps the import gets exactly these numbers.

Workloads (cells), each at ``num_workers`` 2 and 4:

1. ``sleep-io``: 10 ms of blocking I/O per sample (``time.sleep``), batch 16;
2. ``jpeg``: JPEG files through torchvision's ``ImageFolder`` with PIL ``Resize`` +
   ``PILToTensor``, batch 64;
3. ``tokenizer``: a pure-Python WordPiece-style tokenizer over synthetic text, batch 32;
4. ``numpy``: a dozen small numpy ops on a 64x64 float32 crop per sample, batch 64;
5. ``images``: 3x224x224 uint8 tensors, batch 128;
6. ``ints``: trivial ints, batch 32;
7. ``paths``: 2M path strings held in the dataset, shuffled, batch 256 (1,000 batches, 300
   quick: a whole epoch takes too long).

Extra rows of ours: ``torch_spdl-staged`` (``sleep-io``: the dataset split as ``torch-spdl
migrate`` splits a read, the 10 ms wait in a ``load`` stage on I/O threads, the rest in the
worker processes) and ``torch_spdl-thread`` (``jpeg``, ``tokenizer``: ``worker_type="thread"``,
which gives up torch's RNG contract, docs/dataloader.md). Each run is a fresh process
(``_measure.Runner``: peak summed PSS of the process tree, CPU of the tree); the repeats
alternate which side goes first. A run stops after the batch that passes 8 s (3 s quick): a
pathologically slow configuration still gets a rate without eating the budget.

A data loader is judged inside a training script, so every cell runs with three consumers
(``--consumers``), defined in ``_consumers.py`` (shared with ``streaming.py``):

- ``touch``: reads one element of every 4 KiB page of each tensor batch, as a training step
  reads all of it, and nothing else (the loader alone);
- ``train``: a small CNN's forward, backward and SGD step per batch on a 32x3x64x64 input
  (the batch's own when it is such an image batch), at torch's default intra-op threads:
  the training loop needs the cores, the GIL and the allocator too;
- ``gpu``: what a GPU step costs the host: 2 ms of Python holding the GIL (the kernel
  launches), then 8 ms waiting without it (the synchronisation).

The verdict of a row is on the medians of the two sides; the column "side by side" also
compares the runs in the pairs that ran next to each other (the median of the pair ratios,
and in how many pairs ours was at least as fast): on this shared machine a cell's runs move
by 20% over a table's hour, which pairs share and medians do not.

Quick mode: ``num_workers=2`` only, smaller datasets, 3 repeats, the ``touch`` consumer
only, no thread rows. Sized so that the slower side takes about 1-3 s a run in full mode.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import pickle
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _consumers import CONSUMERS, consumer_of
from _consumers import touch_all as _touch_all
from _figures import METRICS, figure_cell, run_values, spread, versus
from _measure import CpuMeter, Result, Spec, machine, measure_all
from dataloader import ImageDataset, IntDataset, SleepDataset, SyncSleepStaged
from torch.utils.data import Dataset

IMPLS = ("torch", "torch_spdl")
STAGED = "torch_spdl-staged"
THREAD = "torch_spdl-thread"

# -- datasets (module level: torch's forked workers see them) ------------------------------


_SYLLABLES = (
    "ka to ri an el mo su ne ver tion pre ing al de co mi ra lu sta ble ex im pro "
    "con ter for ment ly ous ish"
).split()
_WORD = re.compile(r"\w+|[^\w\s]")
PAD, UNK, CLS, SEP = 0, 1, 2, 3


def _synthetic_words(rng: random.Random, count: int) -> list[str]:
    """Made-up words of 1-4 syllables in a random frequency order (list index = rank)."""
    words = sorted({"".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(count)})
    rng.shuffle(words)
    return words


def _synthetic_text(rng: random.Random, words: list[str], cum_weights: list[float]) -> str:
    """Two to five sentences of Zipf-Mandelbrot distributed words, with capitals, numbers
    and punctuation."""
    sentences = []
    for _ in range(rng.randint(2, 5)):
        picks = rng.choices(words, cum_weights=cum_weights, k=rng.randint(6, 20))
        if rng.random() < 0.3:
            picks.insert(rng.randrange(len(picks)), str(rng.randint(1, 9999)))
        if rng.random() < 0.4:
            picks[rng.randrange(len(picks))] += ","
        sentences.append(" ".join(picks).capitalize() + rng.choice(".!?"))
    return " ".join(sentences)


class TokenizerDataset(Dataset):
    """Text -> a fixed-length LongTensor of token ids, all in pure Python: lowercase, split
    on words and punctuation, vocabulary lookup, greedy longest-match subwords
    (``##piece``) for unknown words, ``[UNK]`` when that fails, pad or truncate."""

    LENGTH = 128

    def __init__(self, n: int, pool: int = 2048, seed: int = 0) -> None:
        rng = random.Random(seed)
        words = _synthetic_words(rng, 6000)
        cum = list(itertools.accumulate(1 / (rank + 10) for rank in range(len(words))))
        self.n = n
        self.texts = [_synthetic_text(rng, words, cum) for _ in range(pool)]
        pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words[:1500]]
        pieces += [p for s in (*_SYLLABLES, *"0123456789") for p in (s, "##" + s)]
        pieces += list(",.!?")
        self.vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}

    def __len__(self) -> int:
        return self.n

    def _subwords(self, word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [UNK]
        return ids

    def __getitem__(self, i: int) -> torch.Tensor:
        ids = [CLS]
        for token in _WORD.findall(self.texts[i % len(self.texts)].lower()):
            known = self.vocab.get(token)
            ids += [known] if known is not None else self._subwords(token)
        ids = ids[: self.LENGTH - 1] + [SEP]
        ids += [PAD] * (self.LENGTH - len(ids))
        return torch.tensor(ids, dtype=torch.long)


class NumpyAugmentDataset(Dataset):
    """A 64x64 crop of a float32 image through a dozen small numpy ops (each one a short
    call that holds the GIL for most of its time)."""

    MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.images = np.random.default_rng(seed).random((8, 96, 96, 3), dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        y, x = (i * 7) % 33, (i * 13) % 33
        out = self.images[i % 8, y : y + 64, x : x + 64]  # crop
        if i % 2:
            out = out[:, ::-1]  # horizontal flip
        out = out * np.float32(0.8 + 0.1 * (i % 5))  # contrast
        out += np.float32(0.02 * (i % 3 - 1))  # brightness
        gray = out.mean(axis=2, keepdims=True)
        out = gray + (out - gray) * np.float32(1.1)  # saturation
        np.clip(out, 0.0, 1.0, out=out)
        np.power(out, np.float32(0.9), out=out)  # gamma
        out -= self.MEAN
        out /= self.STD
        out = np.ascontiguousarray(out.transpose(2, 0, 1))  # HWC -> CHW
        return torch.from_numpy(out)


class PathDataset(Dataset):
    """Path strings in a list, as an ImageNet-style file index holds them."""

    def __init__(self, n: int) -> None:
        self.paths = [f"/data/imagenet/train/n{i % 1000:08d}/img_{i:08d}.JPEG" for i in range(n)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> str:
        return self.paths[i]


def _image_folder(root: str) -> Dataset:
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    tf = transforms.Compose([transforms.Resize((224, 224)), transforms.PILToTensor()])
    return ImageFolder(root, transform=tf)


# -- the cells -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    key: str
    title: str
    batch: int
    make: Callable[[int, str], Dataset]  # (n, jpeg root) -> dataset, before the clock
    n: tuple[int, int]  # samples in the dataset (quick, full); 0: the JPEG folder's count
    batches: tuple[int, int] | None = None  # a fixed number of batches, else one epoch
    shuffle: bool = False
    target: float = 1.0  # torch_spdl / torch throughput the issue asks for
    per_worker: bool = False  # n scales with num_workers
    variants: tuple[str, ...] = ()  # extra rows of ours with other arguments
    quick_variants: bool = True  # whether quick mode runs them too
    staged: Callable[[int], Dataset] | None = None  # the dataset as migrate stages it


CELLS = [
    Cell(
        "sleep-io",
        "1. 10 ms blocking I/O, batch 16",
        16,
        lambda n, _: SleepDataset(n),
        (64, 200),
        per_worker=True,
        variants=(STAGED,),
        staged=SyncSleepStaged,
    ),
    Cell(
        "jpeg",
        "2. JPEG ImageFolder + PIL, batch 64",
        64,
        lambda _, root: _image_folder(root),
        (0, 0),
        variants=(THREAD,),
        quick_variants=False,
    ),
    Cell(
        "tokenizer",
        "3. pure-Python tokenizer, batch 32",
        32,
        lambda n, _: TokenizerDataset(n),
        (16_384, 49_152),
        variants=(THREAD,),
        quick_variants=False,
    ),
    Cell(
        "numpy",
        "4. numpy ops on 64x64 crops, batch 64",
        64,
        lambda n, _: NumpyAugmentDataset(n),
        (4096, 16384),
    ),
    Cell(
        "images",
        "5. 3x224x224 uint8, batch 128",
        128,
        lambda n, _: ImageDataset(n),
        (64 * 128, 256 * 128),
    ),
    Cell("ints", "6. trivial ints, batch 32", 32, lambda n, _: IntDataset(n), (32_000, 128_000)),
    Cell(
        "paths",
        "7. 2M path strings, shuffled, batch 256",
        256,
        lambda n, _: PathDataset(n),
        (2_000_000, 2_000_000),
        batches=(300, 1000),
        shuffle=True,
    ),
]
CELL = {c.key: c for c in CELLS}


# -- the script under test -----------------------------------------------------------------


def loader_class(impl: str) -> Callable[..., Iterable[Any]]:
    """The DataLoader a user's script gets from its import."""
    if impl == "torch":
        from torch.utils.data import DataLoader

        return DataLoader
    from torch_spdl import DataLoader

    if impl == THREAD:
        return functools.partial(DataLoader, worker_type="thread")
    return DataLoader


def _count(batch: Any) -> int:
    """Samples in a collated batch: a tensor, ``[inputs, labels]``, or a list of strings."""
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return len(batch[0])
    return len(batch)


def train_loop(
    DataLoader: Callable[..., Iterable[Any]],  # noqa: N803 (it stands for the imported class)
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    shuffle: bool = False,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    consume: Callable[[Any], None] = _touch_all,
) -> dict[str, Any]:
    """The script both sides run: build the loader, read its batches, drop the iterator.

    Timed from building the loader until the iterator is gone (its workers stopped), as an
    epoch of a loader without ``persistent_workers``. It stops early after ``max_batches``,
    or after the batch that passes ``max_seconds`` (a guard against a pathologically slow
    side eating the whole budget; the rate is still samples over seconds)."""
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    extra = {"shuffle": True} if shuffle else {}
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **extra)
    first: float | None = None
    samples = batches = 0
    batch = None
    it = iter(loader)
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        consume(batch)
        samples += _count(batch)
        batches += 1
        if batches == max_batches or (max_seconds and time.perf_counter() - t0 > max_seconds):
            break
    del it, batch
    seconds = time.perf_counter() - t0
    meter.stop()
    return {"samples": samples, "seconds": seconds, "first_batch_s": first, "cpu_s": meter.cpu_s}


def run_cell(
    cell: str,
    impl: str,
    workers: int,
    n: int,
    batches: int | None,
    cap_s: float,
    root: str,
    consumer: str = "touch",
) -> dict:
    """One run (in a fresh process, from ``_cases.swap_cell``): dataset and consumer first,
    then the loop."""
    c = CELL[cell]
    dataset = c.staged(n) if impl == STAGED and c.staged else c.make(n, root)
    consume = consumer_of(consumer)
    return train_loop(
        loader_class(impl), dataset, c.batch, workers, c.shuffle, batches, cap_s, consume
    )


# -- the plan --------------------------------------------------------------------------------


def _kw(**kwargs: object) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(kwargs.items()))


def worker_counts(quick: bool, only: int = 0) -> tuple[int, ...]:
    """The ``num_workers`` of every cell; ``only``: that one alone (0: all)."""
    counts = (2,) if quick else (2, 4)
    return tuple(w for w in counts if only in (0, w))


CAP_S = (3.0, 8.0)  # a run stops after the batch that passes this (quick, full)


def plan(
    quick: bool,
    jpeg_root: str,
    jpeg_count: int,
    only: str = "",
    consumers: tuple[str, ...] = ("touch",),
    workers: int = 0,
) -> list[Spec]:
    """Every run configuration, torch before ours for each cell, consumer and worker count
    (a spec's label is the cell's key, with ``@consumer`` for other consumers than touch)."""
    specs = []
    for c in CELLS:
        if only not in c.key:
            continue
        for consumer in consumers:
            label = c.key if consumer == "touch" else f"{c.key}@{consumer}"
            for w in worker_counts(quick, workers):
                n = c.n[not quick] * (w if c.per_worker else 1) or jpeg_count
                batches = c.batches[not quick] if c.batches else None
                variants = c.variants if c.quick_variants or not quick else ()
                for impl in (*IMPLS, *variants):
                    kw = _kw(
                        cell=c.key,
                        impl=impl,
                        workers=w,
                        n=n,
                        batches=batches,
                        cap_s=CAP_S[not quick],
                        root=jpeg_root,
                        consumer=consumer,
                    )
                    specs.append(Spec("swap", impl, w, "swap_cell", kw, label=label))
    return specs


def _split(label: str) -> tuple[Cell, str]:
    """The cell and the consumer of a spec's label."""
    key, _, consumer = label.partition("@")
    return CELL[key], consumer or "touch"


#: What a variant row of ours is asked to reach, where it differs from its cell's target:
#: staged as migrate stages it, the I/O wait runs on many threads; ``worker_type="thread"``
#: is an explicit choice that gives up torch's reproducibility and crash isolation
#: (docs/dataloader.md), shown for what it trades, with no target (None).
_VARIANT_TARGETS: dict[str, float | None] = {STAGED: 1.5, THREAD: None}
_VARIANT_NAMES = {
    STAGED: ", ours staged as `migrate` splits it",
    THREAD: ", ours `worker_type='thread'`",
}


# -- tables and plot (also in run.py's report) -----------------------------------------------


def _by_cell(results: list[Result]) -> dict[tuple[str, int], dict[str, Result]]:
    out: dict[tuple[str, int], dict[str, Result]] = {}
    for r in results:
        if r.spec.group == "swap":
            out.setdefault((r.spec.label, r.spec.param), {})[r.spec.impl] = r
    order = [c.key for c in CELLS]

    def rank(kv: tuple[tuple[str, int], dict[str, Result]]) -> tuple[int, int, int]:
        cell, consumer = _split(kv[0][0])
        return order.index(cell.key), CONSUMERS.index(consumer), kv[0][1]

    return dict(sorted(out.items(), key=rank))


def rows(results: list[Result]) -> list[tuple[str, int, Result | None, Result | None]]:
    """(row name, workers, torch, ours) for every measured comparison, variants after."""
    out = []
    for (label, workers), by_impl in _by_cell(results).items():
        cell, consumer = _split(label)
        for impl in (*IMPLS[1:], *cell.variants):
            if impl in by_impl:
                name = cell.title
                if consumer != "touch":
                    name += f", consumer {consumer}"
                name += _VARIANT_NAMES.get(impl, "")
                out.append((name, workers, by_impl.get("torch"), by_impl[impl]))
    return out


def target_status(torch_r: Result | None, ours: Result | None, metric: str, target: float) -> str:
    """Whether ``ours`` meets ``target`` x torch (rates: at least; memory: at most), on the
    medians, and whether the spreads make it clear."""

    t, o = spread(run_values(torch_r, metric)), spread(run_values(ours, metric))
    if t is None or o is None:
        return "not measured"
    sign = 1 if METRICS[metric][2] else -1  # compare as "higher is better"
    med_ok = sign * o[0] >= sign * target * t[0]
    worst_o, best_o = (o[1], o[2]) if sign > 0 else (o[2], o[1])
    worst_t, best_t = (t[1], t[2]) if sign > 0 else (t[2], t[1])
    if sign * worst_o >= sign * target * best_t:
        return "met"
    if sign * best_o < sign * target * worst_t:
        return "**not met**"
    return "met on medians (spreads overlap)" if med_ok else "not met on medians (spreads overlap)"


def side_by_side(torch_r: Result | None, ours: Result | None) -> str:
    """The runs compared in pairs: the median of ours / torch over the pairs, and in how
    many pairs ours was at least as fast. The k-th timed run of each side ran in the same
    round of ``_measure.interleave``, next to each other, so a pair shares the machine's
    state of that moment (other tenants, frequency) that the medians of the two sides mix
    with the rest of the table's time. Shown beside the verdict, which is on the medians."""
    rates = zip(run_values(torch_r, "rate"), run_values(ours, "rate"), strict=False)
    pairs = [o / t for t, o in rates if t > 0]  # zip: a side that failed has fewer runs
    if not pairs:
        return "not measured"
    ahead = sum(r >= 1.0 for r in pairs)
    return f"{float(np.median(pairs)):.2f}x, ahead in {ahead} of {len(pairs)}"


def memory_status(torch_r: Result | None, ours: Result | None) -> str:
    """Whether our peak PSS is at most torch's. A training process's peak is bimodal run
    to run, for torch and for us (docs/benchmarks.md: a full collection after the workers
    fork copies the pages it shares with them, or does not), so medians of a few runs land
    on either mode: a row is above torch only when every run of ours is above every run of
    torch's; medians above with overlapping runs are a tie, and say so."""
    t, o = spread(run_values(torch_r, "peak")), spread(run_values(ours, "peak"))
    if t is None or o is None:
        return "not measured"
    if o[0] <= t[0]:
        return "met"
    if o[1] > t[2]:
        return "**not met**"
    return "met: a tie (median above, runs within torch's)"


def target_of(name: str) -> float | None:
    """The throughput target of a row: its cell's, or its variant's (None: no target)."""
    cell = next(c for c in CELLS if name.startswith(c.title))
    variant = next((v for v, text in _VARIANT_NAMES.items() if name.endswith(text)), None)
    return _VARIANT_TARGETS.get(variant, cell.target) if variant else cell.target


def tables(results: list[Result]) -> list[str]:
    """Markdown: throughput with targets, then peak memory, first batch and CPU."""

    cpu_title = METRICS["cpu"][0]
    head1 = (
        "| cell | workers | torch samples/s | torch_spdl samples/s | ratio | verdict | target "
        "| side by side |"
    )
    head2 = (
        "| cell | workers | torch peak PSS, MiB | torch_spdl peak PSS, MiB | ratio | target "
        "(<= torch, beyond the runs' spread) | torch first batch, ms | torch_spdl first batch, "
        f"ms | torch {cpu_title} | torch_spdl {cpu_title} |"
    )
    speed = [head1, "| --- | ---: |" + " ---: |" * 3 + " --- | --- | --- |"]
    memory = [head2, "| --- | ---: |" + " ---: |" * 3 + " --- |" + " ---: |" * 4]
    for name, workers, t, o in rows(results):
        goal = target_of(name)
        ratio, verdict = versus(t, o, "rate")
        target = (
            "none (an explicit choice)"
            if goal is None
            else f">= {goal:.1f}x: {target_status(t, o, 'rate', goal)}"
        )
        rate_t, rate_o = (figure_cell(run_values(r, "rate")) for r in (t, o))
        speed.append(
            f"| {name} | {workers} | {rate_t} | {rate_o} | {ratio} | {verdict} | {target} "
            f"| {side_by_side(t, o)} |"
        )
        peak_ratio, _ = versus(t, o, "peak")
        cells = [figure_cell(run_values(r, m)) for m in ("first", "cpu") for r in (t, o)]
        peak_t, peak_o = (figure_cell(run_values(r, "peak")) for r in (t, o))
        memory.append(
            f"| {name} | {workers} | {peak_t} | {peak_o} "
            f"| {peak_ratio} | {memory_status(t, o)} | " + " | ".join(cells) + " |"
        )
    return ["### Throughput", "", *speed, "", "### Peak memory, first batch, CPU", "", *memory]


def peak_listing(results: list[Result]) -> list[str]:
    """Markdown: what each memory run's peak was made of, by process and kind (MiB)."""
    lines = ["", "### Where each peak was (MiB)", ""]
    listed: set[int] = set()  # torch's result heads its cell's variant rows too: once
    for name, workers, *pair in rows(results):
        for result in pair:
            if result is None or id(result) in listed:
                continue
            listed.add(id(result))
            for run in result.memory_runs:
                where = run.peak_where or "not recorded"
                lines.append(
                    f"- {name}, {workers} workers, {result.spec.impl}: {run.peak_mib:.0f} = {where}"
                )
    return lines


def report_text(results: list[Result], peaks: bool) -> str:
    """The tables, and with ``peaks`` what each memory run's peak was made of."""
    return "\n".join(tables(results) + (peak_listing(results) if peaks else []))


def _ratio_spread(t: Result | None, o: Result | None, metric: str) -> tuple[float, ...] | None:
    """Median ratio ours / torch, and the lowest and highest ratio the spreads allow."""

    ts, os_ = spread(run_values(t, metric)), spread(run_values(o, metric))
    if ts is None or os_ is None or ts[0] == 0:
        return None
    return os_[0] / ts[0], os_[1] / ts[2], os_[2] / ts[1]


def _ratio_panel(ax: Any, table: list, metric: str, workers: list[int], names: list[str]) -> None:
    """Bars from 1 to the median ratio (log scale), one per worker count, spread as whiskers."""
    import matplotlib.ticker as mticker

    width = 0.8 / len(workers)
    for j, w in enumerate(workers):
        label: str | None = f"num_workers={w}"
        for name, wk, t, o in table:
            r = _ratio_spread(t, o, metric)
            if wk != w or r is None:
                continue
            x = names.index(name) + (j - (len(workers) - 1) / 2) * width
            yerr = [[r[0] - r[1]], [r[2] - r[0]]]
            ax.bar(x, r[0] - 1, width, bottom=1, color=f"C{j}", label=label)
            ax.errorbar(x, r[0], yerr=yerr, color="black", capsize=2, linewidth=0.8)
            label = None
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log", base=2)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0.5), max(hi, 2.0))
    ax.yaxis.set_major_locator(
        mticker.FixedLocator([2.0**k for k in range(-5, 6)] + [0.75, 1.5, 3])
    )
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(mticker.NullFormatter())
    ticks = [_short(n) for n in names]
    ax.set_xticks(range(len(names)), ticks, rotation=30, ha="right", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def plot(path: Path, results: list[Result]) -> bool:
    """torch_spdl / torch per cell and worker count: throughput, and peak PSS; the 2x
    throughput targets as dashes."""
    import matplotlib.pyplot as plt

    table = rows(results)
    names = list(dict.fromkeys(name for name, *_ in table))
    if not names:
        return False
    workers = sorted({w for _, w, *_ in table})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, metric in zip(axes, ("rate", "peak"), strict=True):
        _ratio_panel(ax, table, metric, workers, names)
    for i, name in enumerate(names):
        target = target_of(name)
        if target is not None and target != 1.0:
            axes[0].hlines(target, i - 0.45, i + 0.45, colors="red", linestyles="dashed")
    axes[0].set_title("throughput, torch_spdl / torch (above 1: faster; red: target)", fontsize=9)
    axes[1].set_title("peak PSS, torch_spdl / torch (below 1: less memory)", fontsize=9)
    axes[0].set_ylabel("ratio of medians (whiskers: spread)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _short(name: str) -> str:
    short = name.split(",")[0]
    for consumer in CONSUMERS[1:]:
        if f"consumer {consumer}" in name:
            short += f" ({consumer})"
    if "staged" in name:
        short += " (staged)"
    if "'thread'" in name:
        short += " (thread)"
    return short


# -- standalone ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 workers only, smaller runs")
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure (3; 5 full)")
    parser.add_argument("--only", default="", help="only the cells whose key contains this")
    parser.add_argument("--workers", type=int, default=0, help="only this num_workers (2 or 4)")
    parser.add_argument(
        "--peaks", action="store_true", help="also list what each memory run's peak was made of"
    )
    parser.add_argument(
        "--consumers",
        default=None,
        help=f"comma-separated, of {', '.join(CONSUMERS)} (all; touch quick)",
    )
    parser.add_argument(
        "--sample-ms", type=float, default=50.0, help="PSS sampling interval (50, as run.py)"
    )
    parser.add_argument(
        "--memory-runs",
        type=int,
        default=None,
        help="sampled runs per figure for peak memory (3; 1 quick)",
    )
    parser.add_argument("--save", default="", help="also pickle the header and results here")
    parser.add_argument("--render", default="", help="print the tables of a --save file only")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, "rb") as f:
            header, results = pickle.load(f)
        print(header)
        print(report_text(results, args.peaks))
        return 0
    repeats = args.repeats or (3 if args.quick else 5)
    # A training process's peak memory is bimodal run to run (a full collection after the
    # workers fork copies every page of objects they share): one run decides nothing.
    memory_runs = args.memory_runs or (1 if args.quick else 3)
    consumers = tuple(
        (args.consumers or ("touch" if args.quick else ",".join(CONSUMERS))).split(",")
    )
    if not set(consumers) <= set(CONSUMERS):
        parser.error(f"--consumers: each of {', '.join(CONSUMERS)}")
    if not any(args.only in c.key for c in CELLS):
        parser.error(f"--only {args.only!r} matches no cell: {', '.join(CELL)}")
    if not worker_counts(args.quick, args.workers):
        parser.error(f"--workers: one of {worker_counts(args.quick)}")
    from image_decode import write_photo_folder

    info = machine()
    t0 = time.perf_counter()
    count = 256 if args.quick else 1536
    with tempfile.TemporaryDirectory(prefix="torch_spdl_swap_") as tmp:
        write_photo_folder(Path(tmp), count)
        specs = plan(args.quick, tmp, count, args.only, consumers, args.workers)
        results = measure_all(
            specs,
            repeats,
            "swap runs",
            args.sample_ms / 1000,
            memory_runs=memory_runs,
            fresh_memory=not args.quick,
        )
    header = (
        f"torch_spdl {info['torch_spdl']}, torch {info['torch']}, {info['cores']} cores, "
        f"{info['CPU']}; load average at start {info['load average at start']}; median of "
        f"{repeats} timed runs (min-max), fresh process each; peak memory from {memory_runs} "
        f"more run(s) each{'' if args.quick else ' in a fresh interpreter'}, "
        f"PSS sampled every {args.sample_ms:g} ms; timed runs that other processes disturbed "
        f"dropped and run again: {sum(r.dropped for r in results)}; "
        f"{time.perf_counter() - t0:.0f} s\n"
    )
    if args.save:
        with open(args.save, "wb") as f:
            pickle.dump((header, results), f)
    print(header)
    print(report_text(results, args.peaks))
    for r in results:
        if r.error:
            print(f"failed: {r.spec.label} {r.spec.impl} {r.spec.param}: {r.error}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
