"""Train a small CNN with Lightning on JPEGs loaded through a staged torch_spdl dataset.

    .venv/bin/python examples/lightning_image_classification.py --quick

Generates labelled JPEGs on disk (PIL), then loads them with a StagedDataset
(read bytes: io stage; decode + resize: cpu stage; batching by the loader) through
``torch_spdl.lightning.StagedDataModule``, trains one short epoch and checks its own result:
the loss is finite and every image was seen exactly once.
"""

from __future__ import annotations

import argparse
import io
import math
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from PIL import Image

from torch_spdl import StagedDataset
from torch_spdl.lightning import StagedDataModule

COLORS = [(220, 40, 40), (40, 200, 40), (40, 40, 220)]  # class = dominant colour


def make_images(root: Path, n: int, size: int) -> list[tuple[Path, int]]:
    gen = torch.Generator().manual_seed(0)
    items = []
    for i in range(n):
        label = i % len(COLORS)
        noise = torch.randint(0, 60, (size, size, 3), generator=gen, dtype=torch.uint8)
        base = torch.tensor(COLORS[label], dtype=torch.uint8).clamp(max=195)
        pixels = (noise + base).numpy()
        path = root / f"img{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=85)
        items.append((path, label))
    return items


class JpegFolder(StagedDataset):
    """``load`` reads the file (I/O); ``process`` decodes and resizes (PIL releases the GIL)."""

    def __init__(self, items: list[tuple[Path, int]], side: int) -> None:
        self.items = items
        self.side = side

    def __len__(self) -> int:
        return len(self.items)

    def load(self, i: int) -> tuple[int, bytes, int]:
        path, label = self.items[i]
        return i, path.read_bytes(), label

    def process(self, raw: tuple[int, bytes, int]) -> dict[str, object]:
        i, data, label = raw
        img = Image.open(io.BytesIO(data)).convert("RGB").resize((self.side, self.side))
        x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = x.view(self.side, self.side, 3).permute(2, 0, 1).float().div_(255)
        return {"image": x, "label": label, "index": i}


class SmallCNN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, len(COLORS)),
        )
        self.seen: list[int] = []
        self.losses: list[float] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self.net(batch["image"]), batch["label"])
        self.seen.extend(batch["index"].tolist())
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few small images (seconds)")
    parser.add_argument("--images", type=int, default=None)
    args = parser.parse_args()
    n = args.images or (96 if args.quick else 2048)
    side = 32 if args.quick else 64

    pl.seed_everything(0, workers=True)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        items = make_images(Path(tmp), n, size=side * 2)
        print(f"generated {n} JPEGs in {time.perf_counter() - t0:.1f}s")
        dm = StagedDataModule(
            JpegFolder(items, side), batch_size=16, io_concurrency=8, cpu_concurrency=2
        )
        model = SmallCNN()
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            enable_checkpointing=False,
        )
        t0 = time.perf_counter()
        trainer.fit(model, dm)
        elapsed = time.perf_counter() - t0

    assert model.losses and all(math.isfinite(v) for v in model.losses), model.losses
    assert sorted(model.seen) == list(range(n)), "every image must be seen exactly once"
    print(
        f"trained 1 epoch on {n} images in {elapsed:.1f}s ({n / elapsed:.0f} images/s): "
        f"loss {model.losses[0]:.3f} -> {model.losses[-1]:.3f}; every image seen once: OK"
    )


if __name__ == "__main__":
    main()
