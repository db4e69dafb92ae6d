"""Five training scripts in the shape of the common public ones, run whole with torch's
DataLoader and with only the import swapped.

Run: ``python benchmarks/real_scripts.py [--quick] [--repeats N] [--only TEXT]``. Prints a
Markdown table; asserts nothing.

Why: a data loader is judged inside a training script, not alone. The training loop needs
the cores, the GIL, the allocator and the global RNGs, and scripts rely on torch's loader
leaving all of them alone. Each script below is written once, the way its public model is
written (pytorch/examples' imagenet with an ``ImageFolder`` and with ``--dummy``,
super_resolution's own PIL dataset, torchvision's detection reference with dict targets
and ``collate_fn``, a Lightning ``DataModule``), and gets its ``DataLoader`` from its import
alone: ``from torch.utils.data import DataLoader`` or ``from torch_spdl import DataLoader``.
Nothing else differs. Every run is a fresh ``python`` process (interpreter start and
imports included in the whole-run time, as a user pays them); the two sides alternate
which goes first; the figures are medians of the runs with their spread.

Each script seeds the RNGs (``torch``, ``random``, NumPy) as those scripts do with
``--seed``, and records its loss after every step: the loss curves of the two sides must
be identical, run after run (torch's workers' seeds and order are part of the contract).

Per script: whole run (process start to exit: about 4.5 s of it is the interpreter and
``import torch, torchvision``, the same for both sides, and ``import torch_spdl`` adds
about 0.1 s), the mean time of a training epoch (the epochs after the first; the first
includes start-up), and whether the loss curves of every run of both sides are the same.
Full mode trains 5 epochs (quick: 2), short beside real runs, whose start-up is a smaller
share.

Before the runs, torch_spdl's modules are byte-compiled (``compileall``), as ``pip install``
does for a wheel: torch's modules come compiled, and a checkout installed in editable mode
under ``PYTHONDONTWRITEBYTECODE=1`` (as on the development machine) would otherwise
compile torch_spdl's ~80 modules afresh in every run, about 75 ms that no installed user
pays (``from torch_spdl import DataLoader``: 125 ms from source, 48 ms compiled, measured
after ``import lightning, torchvision``).

A run that other processes disturbed is dropped and run again, by ``_measure``'s rule (the
machine's busy CPU during the run, less the run's own, over 5% of its core-seconds): on a
shared 2-core machine one import of torch elsewhere made a run 2 s slower and one of its
epochs 6 s long where it takes 0.8 s, which five medians do not absorb.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _measure import FOREIGN_FLOOR_S, FOREIGN_LIMIT, RETRIES, busy_cpu_s, cpu_count

SCRIPTS = ("imagenet", "dummy", "superres", "detection", "lightning")
IMPLS = ("torch", "torch_spdl")


# -- data the scripts read (made once by the parent, before any run) ----------------------


def make_image_folder(root: Path, count: int, classes: int = 4, seed: int = 0) -> None:
    """``count`` photo-like 160x120 JPEGs in ImageFolder layout (``class_k/img_i.jpg``)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:120, 0:160]
    for i in range(count):
        base = rng.integers(0, 256, 3)
        img = (base + 60 * np.sin(x[..., None] / (7 + i % 11) + y[..., None] / 13)).clip(0, 255)
        img = (img + rng.normal(0, 12, img.shape)).clip(0, 255).astype(np.uint8)
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        (folder / f"img_{i:05d}.jpg").write_bytes(buf.getvalue())


# -- the scripts (each gets the DataLoader its import gave it) ----------------------------


def _seed(seed: int = 0) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _small_cnn(classes: int, channels: int = 3) -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def _epochs(quick: bool) -> int:
    return 2 if quick else 5


def _fit(loader: Any, opt: Any, loss_of: Callable[[Any], Any], epochs: int) -> dict:
    """The training loop every script shares: a step per batch, the loss kept, each epoch
    timed."""
    losses, epoch_s = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for batch in loader:
            loss = loss_of(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        epoch_s.append(time.perf_counter() - t0)
    return {"losses": losses, "epoch_s": epoch_s}


def _classify(DataLoader: Any, dataset: Any, epochs: int, classes: int, workers: int) -> dict:  # noqa: N803
    """pytorch/examples' imagenet main loop, small: SGD, cross entropy, train mode."""
    import torch
    from torch import nn

    model = _small_cnn(classes)
    model.train()
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=workers)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    return _fit(loader, opt, lambda batch: loss_fn(model(batch[0]), batch[1]), epochs)


def script_imagenet(DataLoader: Any, root: str, quick: bool) -> dict:  # noqa: N803
    """ImageFolder + RandomResizedCrop/RandomHorizontalFlip/ToTensor/Normalize, 2 workers."""
    from torchvision import datasets, transforms

    _seed()
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.ImageFolder(
        os.path.join(root, "train"),
        transforms.Compose(
            [
                transforms.RandomResizedCrop(64),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    return _classify(DataLoader, dataset, _epochs(quick), 4, 2)


def script_dummy(DataLoader: Any, root: str, quick: bool) -> dict:  # noqa: N803
    """imagenet's ``--dummy``: torchvision's FakeData through ToTensor, 2 workers."""
    from torchvision import datasets, transforms

    _seed()
    dataset = datasets.FakeData(384 if quick else 1024, (3, 64, 64), 10, transforms.ToTensor())
    return _classify(DataLoader, dataset, _epochs(quick), 10, 2)


class SuperResolutionData:
    """super_resolution's dataset: the Y channel of each image, center-cropped and scaled
    down by 3 for the input, the crop itself as the target (PIL all the way)."""

    def __init__(self, paths: list[str], crop: int = 96, factor: int = 3) -> None:
        from torchvision import transforms

        self.paths = paths
        self.input_transform = transforms.Compose(
            [
                transforms.CenterCrop(crop),
                transforms.Resize(crop // factor),
                transforms.ToTensor(),
            ]
        )
        self.target_transform = transforms.Compose(
            [transforms.CenterCrop(crop), transforms.ToTensor()]
        )

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from PIL import Image

        y, _, _ = Image.open(self.paths[index]).convert("YCbCr").split()
        return self.input_transform(y), self.target_transform(y.copy())

    def __len__(self) -> int:
        return len(self.paths)


def script_superres(DataLoader: Any, root: str, quick: bool) -> dict:  # noqa: N803
    """super_resolution: its own PIL dataset, 4 loader threads/workers (its ``--threads``),
    the sub-pixel CNN, Adam and MSE."""
    import torch
    from torch import nn

    _seed()
    paths = sorted(str(p) for p in Path(root, "train").rglob("*.jpg"))
    dataset = SuperResolutionData(paths[: 192 if quick else 512])

    class Net(nn.Module):
        def __init__(self, factor: int = 3) -> None:
            super().__init__()
            self.relu = nn.ReLU()
            self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.conv3 = nn.Conv2d(32, 16, 3, padding=1)
            self.conv4 = nn.Conv2d(16, factor**2, 3, padding=1)
            self.shuffle = nn.PixelShuffle(factor)

        def forward(self, x: Any) -> Any:
            x = self.relu(self.conv1(x))
            x = self.relu(self.conv2(x))
            x = self.relu(self.conv3(x))
            return self.shuffle(self.conv4(x))

    model = Net()
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    return _fit(loader, opt, lambda batch: loss_fn(model(batch[0]), batch[1]), _epochs(quick))


class DetectionData:
    """A detection dataset as torchvision's references read one: an image from its file,
    a target dict (``boxes``, ``labels``, ``image_id``, ``area``), and a random horizontal
    flip that flips the boxes too (drawn from torch's global RNG, as theirs is)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Any]]:
        import torch
        from PIL import Image
        from torchvision.transforms import functional as F  # noqa: N812

        image = F.pil_to_tensor(Image.open(self.paths[index]).convert("RGB"))
        g = torch.Generator().manual_seed(index)  # the annotations of this image
        n = 1 + index % 3
        xy = torch.rand(n, 2, generator=g) * 100
        wh = 10 + torch.rand(n, 2, generator=g) * 50
        boxes = torch.cat([xy, xy + wh], dim=1)
        if torch.rand(1) < 0.5:
            image = image.flip(-1)
            width = image.shape[-1]
            boxes = boxes[:, [2, 1, 0, 3]] * torch.tensor([-1, 1, -1, 1]) + torch.tensor(
                [width, 0, width, 0]
            )
        target = {
            "boxes": boxes,
            "labels": torch.randint(1, 5, (n,), generator=g),
            "image_id": index,
            "area": (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]),
        }
        return F.convert_image_dtype(image, torch.float), target

    def __len__(self) -> int:
        return len(self.paths)


def collate_fn(batch: list[Any]) -> tuple[Any, ...]:
    """torchvision's detection references' ``utils.collate_fn``."""
    return tuple(zip(*batch, strict=True))


def script_detection(DataLoader: Any, root: str, quick: bool) -> dict:  # noqa: N803
    """torchvision's detection reference, small: dict targets, ``collate_fn``, a list of
    images per batch; the model regresses the first box and classifies its label."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    _seed()
    paths = sorted(str(p) for p in Path(root, "train").rglob("*.jpg"))
    dataset = DetectionData(paths[: 192 if quick else 512])
    backbone = _small_cnn(64)
    box_head, cls_head = nn.Linear(64, 4), nn.Linear(64, 5)
    params = [*backbone.parameters(), *box_head.parameters(), *cls_head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate_fn)

    def loss_of(batch: Any) -> Any:
        images, targets = batch
        x = torch.stack([F.interpolate(im[None], size=(96, 128))[0] for im in images])
        feats = backbone(x)
        boxes = torch.stack([t["boxes"][0] for t in targets]) / 100
        labels = torch.stack([t["labels"][0] for t in targets])
        return F.smooth_l1_loss(box_head(feats), boxes) + F.cross_entropy(cls_head(feats), labels)

    return _fit(loader, opt, loss_of, _epochs(quick))


def script_lightning(DataLoader: Any, root: str, quick: bool) -> dict:  # noqa: N803
    """A LightningDataModule whose ``train_dataloader`` builds the loader, a
    LightningModule, ``Trainer.fit`` on the CPU, ``seed_everything(0, workers=True)``."""
    import lightning as L  # noqa: N812
    import torch
    from torch import nn
    from torchvision import datasets, transforms

    L.seed_everything(0, workers=True, verbose=False)

    class Data(L.LightningDataModule):
        def setup(self, stage: str) -> None:
            self.train = datasets.ImageFolder(
                os.path.join(root, "train"),
                transforms.Compose(
                    [
                        transforms.RandomResizedCrop(64),
                        transforms.RandomHorizontalFlip(),
                        transforms.ToTensor(),
                    ]
                ),
            )

        def train_dataloader(self) -> Any:
            return DataLoader(self.train, batch_size=32, shuffle=True, num_workers=2)

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _small_cnn(4)
            self.losses: list[float] = []
            self.epoch_s: list[float] = []
            self._t0 = 0.0

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            images, target = batch
            loss = nn.functional.cross_entropy(self.net(images), target)
            self.losses.append(loss.item())
            return loss

        def on_train_epoch_start(self) -> None:
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self) -> None:
            self.epoch_s.append(time.perf_counter() - self._t0)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    model = Model()
    trainer = L.Trainer(
        max_epochs=_epochs(quick),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=Data())
    return {"losses": model.losses, "epoch_s": model.epoch_s}


SCRIPT: dict[str, Callable[[Any, str, bool], dict]] = {
    "imagenet": script_imagenet,
    "dummy": script_dummy,
    "superres": script_superres,
    "detection": script_detection,
    "lightning": script_lightning,
}


def child(script: str, impl: str, root: str, quick: bool) -> None:
    """One whole run, in this fresh process: the import, then the script."""
    if impl == "torch":
        from torch.utils.data import DataLoader
    else:
        from torch_spdl import DataLoader
    t0 = time.perf_counter()
    out = SCRIPT[script](DataLoader, root, quick)
    out["script_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out))


# -- the parent: alternate, measure, tabulate -------------------------------------------------


def byte_compile_torch_spdl() -> None:
    """Write the ``.pyc`` files of the torch_spdl package the children will import, as an
    installed wheel has them (``compileall`` writes even under ``PYTHONDONTWRITEBYTECODE``)."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("torch_spdl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch_spdl is not importable")
    for location in spec.submodule_search_locations:
        compileall.compile_dir(location, quiet=1)


def _run_child(script: str, impl: str, root: str, quick: bool) -> dict:
    """One whole run in a fresh process, with its wall time and the CPU that other
    processes of the machine used meanwhile (``foreign_cpu_s``: busy CPU less the run's)."""
    import resource

    cmd = [sys.executable, os.path.abspath(__file__), "--child", script, impl, root]
    if quick:
        cmd.append("--quick")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    own0, busy0 = usage.ru_utime + usage.ru_stime, busy_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = usage.ru_utime + usage.ru_stime - own0  # the run and its reaped workers
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{script} with {impl} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    out["wall_s"] = wall
    out["foreign_cpu_s"] = max(0.0, busy_cpu_s() - busy0 - own)
    return out


def run_once(script: str, impl: str, root: str, quick: bool) -> dict:
    """:func:`_run_child`, again while other processes took more than ``FOREIGN_LIMIT`` of
    the run's core-seconds (at most ``RETRIES`` times; ``dropped`` counts the runs left)."""
    dropped = 0
    out = _run_child(script, impl, root, quick)
    limit = max(FOREIGN_FLOOR_S, FOREIGN_LIMIT * out["wall_s"] * cpu_count())
    while out["foreign_cpu_s"] > limit and dropped < RETRIES:
        note = f"{script} {impl}: run again, {out['foreign_cpu_s']:.2f} CPU-s of others"
        print(note, file=sys.stderr)
        dropped += 1
        out = _run_child(script, impl, root, quick)
    out["dropped"] = dropped
    return out


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _digest(losses: list[float]) -> str:
    return hashlib.sha1(json.dumps(losses).encode()).hexdigest()[:10]


def table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    out = [
        "| script | torch whole run, s | torch_spdl whole run, s | speed-up | torch epoch, s "
        "| torch_spdl epoch, s | speed-up | loss curves |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for script, by_impl in results.items():
        t, o = by_impl["torch"], by_impl["torch_spdl"]
        wall_t, wall_o = [r["wall_s"] for r in t], [r["wall_s"] for r in o]
        # a training epoch after the first (the first includes start-up)
        ep_t = [statistics.mean(r["epoch_s"][1:]) for r in t]
        ep_o = [statistics.mean(r["epoch_s"][1:]) for r in o]
        curves = {_digest(r["losses"]) for r in t + o}
        same = "identical" if len(curves) == 1 else f"**{len(curves)} different**"
        steps = len(t[0]["losses"])
        out.append(
            f"| {script} | {_fmt(wall_t)} | {_fmt(wall_o)} | "
            f"{statistics.median(wall_t) / statistics.median(wall_o):.2f}x | {_fmt(ep_t)} | "
            f"{_fmt(ep_o)} | {statistics.median(ep_t) / statistics.median(ep_o):.2f}x | "
            f"{same} ({steps} steps, {len(t) + len(o)} runs) |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, 2 epochs (5 full)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side (5; 2 quick)")
    parser.add_argument("--only", default="", help="only the scripts whose name contains this")
    parser.add_argument(
        "--child", nargs=3, metavar=("SCRIPT", "IMPL", "ROOT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, quick=args.quick)
        return 0
    repeats = args.repeats or (2 if args.quick else 5)
    scripts = [s for s in SCRIPTS if args.only in s]
    if not scripts:
        parser.error(f"--only {args.only!r} matches no script: {', '.join(SCRIPTS)}")
    import torch

    byte_compile_torch_spdl()
    t0 = time.perf_counter()
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="torch_spdl_scripts_") as root:
        make_image_folder(Path(root, "train"), 256 if args.quick else 512)
        for script in scripts:
            results[script] = {impl: [] for impl in IMPLS}
            for r in range(repeats):
                order = IMPLS if r % 2 == 0 else IMPLS[::-1]
                for impl in order:
                    results[script][impl].append(run_once(script, impl, root, args.quick))
                    print(
                        f"{script} {impl} run {r + 1}: {results[script][impl][-1]['wall_s']:.2f} s",
                        file=sys.stderr,
                    )
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores; load average at start "
        f"{os.getloadavg()[0]:.1f}; median of {repeats} runs per side (min-max), alternating, "
        f"each a fresh process; runs that other processes disturbed dropped and run again: "
        f"{sum(r['dropped'] for s in results.values() for rs in s.values() for r in rs)}; "
        f"{time.perf_counter() - t0:.0f} s\n"
    )
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
