"""A training script in the shape of torchvision's detection reference
(``references/detection/train.py``) with a dataset of its own, as its tutorial writes one:
run by ``benchmarks/real_scripts.py`` as written, with its import swapped, and after
``torch-spdl migrate --write``.

Kept: a map-style dataset that reads an image from its file and builds a target dict
(``boxes``, ``labels``, ``image_id``, ``area``), with a random horizontal flip that flips
the boxes too, drawn from torch's global generator as the reference's transforms draw;
``RandomSampler`` inside a ``BatchSampler`` (``drop_last=True``), the reference's
``collate_fn`` (a tuple of lists), ``--workers``, SGD with momentum. Smaller: the model is
a five-layer CNN regressing the first box and classifying its label (for the reference's
Faster R-CNN), the annotations are drawn from a generator seeded by the index (a file of
them would be read the same way), and there is no evaluation. Added: the loss of every
step, each epoch's time and this process's CPU time, printed as one ``RESULT`` line of
JSON at the end.
"""

import argparse
import json
import os
import time

import torch
import torch.utils.data
from PIL import Image
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import functional as TF  # noqa: N812


class ShapesDetection(Dataset):
    def __init__(self, root):
        self.root = root
        self.imgs = sorted(
            os.path.join(d, f)
            for d in sorted(os.listdir(root))
            for f in os.listdir(os.path.join(root, d))
        )

    def __getitem__(self, idx):
        img = TF.pil_to_tensor(Image.open(os.path.join(self.root, self.imgs[idx])).convert("RGB"))
        g = torch.Generator().manual_seed(idx)  # this image's annotations
        n = 1 + idx % 3
        xy = torch.rand(n, 2, generator=g) * 100
        wh = 10 + torch.rand(n, 2, generator=g) * 50
        boxes = torch.cat([xy, xy + wh], dim=1)
        if torch.rand(1) < 0.5:
            img = img.flip(-1)
            width = img.shape[-1]
            boxes = boxes[:, [2, 1, 0, 3]] * torch.tensor([-1, 1, -1, 1]) + torch.tensor(
                [width, 0, width, 0]
            )
        target = {
            "boxes": boxes,
            "labels": torch.randint(1, 5, (n,), generator=g),
            "image_id": idx,
            "area": (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]),
        }
        return TF.convert_image_dtype(img, torch.float), target

    def __len__(self):
        return len(self.imgs)


def collate_fn(batch):
    return tuple(zip(*batch, strict=True))


class Detector(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.box_head, self.cls_head = nn.Linear(64, 4), nn.Linear(64, num_classes)

    def forward(self, images, targets):
        x = torch.stack([F.interpolate(im[None], size=(96, 128))[0] for im in images])
        feats = self.backbone(x)
        boxes = torch.stack([t["boxes"][0] for t in targets]) / 100
        labels = torch.stack([t["labels"][0] for t in targets])
        return {
            "loss_box_reg": F.smooth_l1_loss(self.box_head(feats), boxes),
            "loss_classifier": F.cross_entropy(self.cls_head(feats), labels),
        }


def train_one_epoch(model, optimizer, data_loader, device, record):
    model.train()
    for images, targets in data_loader:
        images = [image.to(device) for image in images]
        targets = [
            {k: v.to(device) if torch.is_tensor(v) else v for k, v in t.items()} for t in targets
        ]
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        optimizer.zero_grad()
        losses.backward()
        optimizer.step()
        record.append(losses.item())


def main():
    parser = argparse.ArgumentParser(description="Detection training, small")
    parser.add_argument("data", help="DATA/train/CLASS/*.jpg")
    parser.add_argument("-b", "--batch-size", default=8, type=int)
    parser.add_argument("--epochs", default=5, type=int)
    parser.add_argument("-j", "--workers", default=2, type=int)
    parser.add_argument("--lr", default=0.01, type=float)
    parser.add_argument("--seed", default=0, type=int)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    dataset = ShapesDetection(os.path.join(args.data, "train"))
    train_sampler = torch.utils.data.RandomSampler(dataset)
    train_batch_sampler = torch.utils.data.BatchSampler(
        train_sampler, args.batch_size, drop_last=True
    )
    data_loader = DataLoader(
        dataset, batch_sampler=train_batch_sampler, num_workers=args.workers, collate_fn=collate_fn
    )
    model = Detector().to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)

    losses, epoch_s, cpu0 = [], [], time.process_time()
    for _epoch in range(args.epochs):
        t0 = time.perf_counter()
        train_one_epoch(model, optimizer, data_loader, device, losses)
        epoch_s.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    print("RESULT " + json.dumps({"losses": losses, "epoch_s": epoch_s, "cpu_s": cpu_s}))


if __name__ == "__main__":
    main()
