"""A training script in the shape of torchvision's classification reference
(``references/classification/train.py`` with its ``presets.py``), run with ``--device
cpu``: by ``benchmarks/real_scripts.py`` as written, with its import swapped, and after
``torch-spdl migrate --write``.

Kept as the reference has it, because it decides what the loader is given:
``ClassificationPresetTrain`` built as the preset builds it for the PIL backend
(RandomResizedCrop with the interpolation and ``antialias=True``, RandomHorizontalFlip
when ``hflip_prob > 0``, PILToTensor, ConvertImageDtype to float, Normalize), passed to
``torchvision.datasets.ImageFolder``; ``torch.utils.data.RandomSampler`` as the sampler;
``torch.utils.data.DataLoader`` spelled in full with ``sampler=``, ``num_workers``,
``pin_memory=True`` (also on a CPU-only machine, as the reference passes it) and
``collate_fn=default_collate``; a model from ``torchvision.models.get_model`` (no
weights); cross entropy with label smoothing, SGD with momentum and weight decay, a
StepLR; ``train_one_epoch`` moving each batch to ``--device``, stepping, and computing
top-1/top-5 accuracy. Smaller: 64-pixel crops, ``mobilenet_v3_small`` for ResNet-50, no
evaluation, no distributed mode, logger or checkpoints. Added: ``torch.manual_seed`` (the
reference does not seed; the benchmark compares loss curves), and the loss of every step,
each epoch's time and this process's CPU time, printed as one ``RESULT`` line of JSON.
"""

import argparse
import json
import os
import time

import torch
import torch.utils.data
import torchvision
from torch import nn
from torch.utils.data.dataloader import default_collate
from torchvision import transforms
from torchvision.transforms.functional import InterpolationMode

# -- presets.py ------------------------------------------------------------------------------


class ClassificationPresetTrain:
    def __init__(
        self,
        *,
        crop_size,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        interpolation=InterpolationMode.BILINEAR,
        hflip_prob=0.5,
        backend="pil",
    ):
        trans = []
        backend = backend.lower()
        if backend == "tensor":
            trans.append(transforms.PILToTensor())
        elif backend != "pil":
            raise ValueError(f"backend can be 'tensor' or 'pil', but got {backend}")
        trans.append(
            transforms.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True)
        )
        if hflip_prob > 0:
            trans.append(transforms.RandomHorizontalFlip(hflip_prob))
        if backend == "pil":
            trans.append(transforms.PILToTensor())
        trans.extend(
            [transforms.ConvertImageDtype(torch.float), transforms.Normalize(mean=mean, std=std)]
        )
        self.transforms = transforms.Compose(trans)

    def __call__(self, img):
        return self.transforms(img)


# -- train.py --------------------------------------------------------------------------------


def accuracy(output, target, topk=(1,)):
    with torch.inference_mode():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target[None])
        return [
            correct[:k].flatten().sum(dtype=torch.float32) * (100.0 / target.size(0)) for k in topk
        ]


def train_one_epoch(model, criterion, optimizer, data_loader, device, record):
    model.train()
    for image, target in data_loader:
        image, target = image.to(device), target.to(device)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        acc1, acc5 = accuracy(output, target, topk=(1, 3))
        record.append(loss.item())


def load_data(traindir, args):
    interpolation = InterpolationMode(args.interpolation)
    dataset = torchvision.datasets.ImageFolder(
        traindir,
        ClassificationPresetTrain(crop_size=args.train_crop_size, interpolation=interpolation),
    )
    train_sampler = torch.utils.data.RandomSampler(dataset)
    return dataset, train_sampler


def main(args):
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dataset, train_sampler = load_data(os.path.join(args.data_path, "train"), args)
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=True,
        collate_fn=default_collate,
    )
    num_classes = len(dataset.classes)
    model = torchvision.models.get_model(args.model, weights=None, num_classes=num_classes)
    model.to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    losses, epoch_s, cpu0 = [], [], time.process_time()
    for _epoch in range(args.epochs):
        t0 = time.perf_counter()
        train_one_epoch(model, criterion, optimizer, data_loader, device, losses)
        lr_scheduler.step()
        epoch_s.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    print("RESULT " + json.dumps({"losses": losses, "epoch_s": epoch_s, "cpu_s": cpu_s}))


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training, small")
    parser.add_argument(
        "--data-path", required=True, type=str, help="DATA (DATA/train/CLASS/*.jpg)"
    )
    parser.add_argument("--model", default="mobilenet_v3_small", type=str)
    parser.add_argument("--device", default="cuda", type=str, help="device (cuda or cpu)")
    parser.add_argument("-b", "--batch-size", default=32, type=int)
    parser.add_argument("--epochs", default=5, type=int)
    parser.add_argument("-j", "--workers", default=2, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--label-smoothing", default=0.0, type=float)
    parser.add_argument("--interpolation", default="bilinear", type=str)
    parser.add_argument("--train-crop-size", default=64, type=int)
    parser.add_argument("--seed", default=0, type=int)
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
