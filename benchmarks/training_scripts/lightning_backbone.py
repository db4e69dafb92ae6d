"""A training script in the shape of Lightning's ``backbone_image_classifier.py`` example
(``examples/pytorch/basics``): run by ``benchmarks/real_scripts.py`` as written, with its
import swapped, and after ``torch-spdl migrate --write``.

Kept as the example has it, because it decides what the loader and ``migrate`` see: the
MNIST of ``lightning.pytorch.demos`` (a dataset held in memory, loaded from one file with
``torch.load``; ``PL_USE_MOCKED_MNIST=1`` makes it read ``DATA/MNIST/complete/*.pt``, which
the benchmark writes, instead of downloading torchvision's), split by ``random_split``
with a seeded generator; a ``LightningDataModule`` whose ``train_dataloader`` and
``val_dataloader`` each build ``DataLoader(dataset, batch_size=...)`` with no workers; the
two-layer ``Backbone``, ``LitClassifier`` (cross entropy, ``self.log``, Adam), a seed of
1234, and ``Trainer.fit`` on the CPU. Smaller: 6,000 training images for 60,000, and a
plain ``Trainer`` for ``LightningCLI``, with no logger, checkpoint or progress bar.
Added: the loss of every step, each training epoch's time and this process's CPU time,
printed as one ``RESULT`` line of JSON at the end.
"""

import argparse
import json
import time

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from lightning.pytorch.demos.mnist_datamodule import MNIST
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, random_split


class Backbone(torch.nn.Module):
    def __init__(self, hidden_dim=128):
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, hidden_dim)
        self.l2 = torch.nn.Linear(hidden_dim, 10)

    def forward(self, x):
        x = x.view(x.size(0), -1)
        x = torch.relu(self.l1(x))
        return torch.relu(self.l2(x))


class LitClassifier(LightningModule):
    def __init__(self, backbone=None, learning_rate=0.0001):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone if backbone is not None else Backbone()
        self.losses, self.epoch_s, self._t0 = [], [], 0.0

    def forward(self, x):
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("valid_loss", F.cross_entropy(self(x), y), on_step=True)

    def on_train_epoch_start(self):
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self):
        self.epoch_s.append(time.perf_counter() - self._t0)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class MyDataModule(LightningDataModule):
    def __init__(self, data_dir, batch_size=32):
        super().__init__()
        dataset = MNIST(data_dir, train=True, download=False)
        self.mnist_train, self.mnist_val = random_split(
            dataset, [5500, 500], generator=torch.Generator().manual_seed(42)
        )
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.mnist_train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.mnist_val, batch_size=self.batch_size)


def main():
    parser = argparse.ArgumentParser(description="Lightning backbone classifier, small")
    parser.add_argument("data", help="DATA (DATA/MNIST/complete/training.pt)")
    parser.add_argument("--max_epochs", type=int, default=5)
    args = parser.parse_args()
    seed_everything(1234, verbose=False)
    model, datamodule = LitClassifier(Backbone()), MyDataModule(args.data)
    trainer = Trainer(
        max_epochs=args.max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    cpu0 = time.process_time()
    trainer.fit(model, datamodule=datamodule)
    cpu_s = time.process_time() - cpu0
    print(
        "RESULT " + json.dumps({"losses": model.losses, "epoch_s": model.epoch_s, "cpu_s": cpu_s})
    )


if __name__ == "__main__":
    main()
