"""Module-level (so picklable for ddp_spawn) datasets, modules and callbacks for
tests/test_lightning.py."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from torch_spdl import DataLoader, StagedDataset


def features(i: int) -> torch.Tensor:
    return torch.tensor([float(i % 7), float(i % 3), 1.0])


class IndexData(Dataset):
    """Plain map-style dataset: sample ``i`` carries its own index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": features(int(i)), "idx": int(i)}


class StagedIndexData(StagedDataset):
    """Staged dataset: ``load`` returns the index, ``process`` builds the sample."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> int:
        return int(i)

    def process(self, i: int) -> dict[str, Any]:
        return {"x": features(i), "idx": i}


def load_index(key: int) -> int:
    return int(key)


def process_index(i: int) -> dict[str, Any]:
    return {"x": features(i), "idx": i}


class PlainDataModule(pl.LightningDataModule):
    """An ordinary LightningDataModule; only its DataLoader import changed."""

    def __init__(self, n: int = 40, batch_size: int = 4, num_workers: int = 2) -> None:
        super().__init__()
        self.n = n
        self.batch_size = batch_size
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            IndexData(self.n),
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(IndexData(self.n // 2), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(IndexData(self.n // 2), batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(IndexData(self.n // 2), batch_size=self.batch_size)


class Recorder(pl.LightningModule):
    """A linear model that records which sample indices each step received.

    ``seen[stage][epoch]`` lists the indices in the order they arrived. With ``out_dir``
    each rank writes its record to ``out_dir/<tag>-rank<r>.json`` when a stage ends (so
    ddp_spawn children can report back).
    """

    def __init__(self, out_dir: str | None = None, tag: str = "run") -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.out_dir = out_dir
        self.tag = tag
        self.seen: dict[str, dict[int, list[int]]] = {}
        self.losses: list[float] = []

    def _record(self, stage: str, batch: dict[str, Any]) -> torch.Tensor:
        epoch = self.current_epoch if stage == "train" else 0
        self.seen.setdefault(stage, {}).setdefault(epoch, []).extend(batch["idx"].tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self._record("train", batch)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val_loss", self._record("val", batch), batch_size=len(batch["idx"]))

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("test_loss", self._record("test", batch), batch_size=len(batch["idx"]))

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self._record("predict", batch)
        return batch["idx"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _dump(self) -> None:
        if self.out_dir is None:
            return
        path = os.path.join(self.out_dir, f"{self.tag}-rank{self.global_rank}.json")
        with open(path, "w") as f:
            json.dump({"seen": self.seen, "world_size": self.trainer.world_size}, f)

    def on_fit_end(self) -> None:
        self._dump()


class CrashAtStep(pl.Callback):
    """Simulates a crash: raises once training reaches ``step`` optimizer steps."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            raise Crash(f"crash at step {trainer.global_step}")


class Crash(RuntimeError):
    pass


def read_ranks(out_dir: str, tag: str, world_size: int) -> list[dict[str, Any]]:
    records = []
    for r in range(world_size):
        with open(os.path.join(out_dir, f"{tag}-rank{r}.json")) as f:
            records.append(json.load(f))
    return records


def ddp_main(kind: str, out_dir: str, strategy: str = "ddp") -> None:
    """Two CPU processes (gloo), two epochs; each rank writes what it saw to ``out_dir``."""
    from torch_spdl.lightning import StagedDataModule

    pl.seed_everything(3)
    if kind == "plain":
        dm: pl.LightningDataModule = PlainDataModule(n=40, batch_size=4)
    else:
        dm = StagedDataModule(StagedIndexData(40), batch_size=4, seed=3)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(SamplerRecorder(out_dir, kind), dm)


class SamplerRecorder(Recorder):
    """Also records which loader and sampler classes Lightning ended up using."""

    def _dump(self) -> None:
        loader = self.trainer.train_dataloader
        self.seen["classes"] = {  # type: ignore[assignment]
            "loader": (
                "torch_spdl.DataLoader"
                if type(loader) is DataLoader
                else type(loader).__module__ + "." + type(loader).__qualname__
            ),
            "sampler": type(loader.sampler).__qualname__,
        }
        super()._dump()


if __name__ == "__main__":  # python tests/_lightning_helpers.py KIND OUT_DIR (strategy="ddp")
    import sys

    ddp_main(sys.argv[1], sys.argv[2])
