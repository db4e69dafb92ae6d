"""A training script in the shape of pytorch/examples' ``imagenet/main.py``, small enough
for two CPU cores: run by ``benchmarks/real_scripts.py`` as written (torch's loader), with
its import swapped, and after ``torch-spdl migrate --write``.

Kept as the public script has it: ``ImageFolder`` over ``DATA/train`` with
RandomResizedCrop, RandomHorizontalFlip, ToTensor and Normalize (or ``--dummy``:
``FakeData`` through ToTensor), ``torch.utils.data.DataLoader`` spelled in full with
``shuffle=(train_sampler is None)``, ``pin_memory=True`` and ``--workers``, ``--seed``
seeding ``random`` and torch, SGD with momentum and weight decay, cross entropy, top-1
accuracy each step. Smaller: 64-pixel crops, a five-layer CNN for ``--arch``'s ResNet, and
no validation. Added: the loss of every step, each epoch's time and this process's CPU
time, printed as one ``RESULT`` line of JSON at the end, which the benchmark compares.
"""

import argparse
import json
import os
import random
import time

import torch
import torch.nn as nn
import torch.optim
import torch.utils.data
import torchvision.datasets as datasets
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="ImageNet-style training, small")
parser.add_argument("data", help="path to the dataset (DATA/train/CLASS/*.jpg)")
parser.add_argument("-j", "--workers", default=2, type=int, help="data loading workers")
parser.add_argument("--epochs", default=5, type=int)
parser.add_argument("-b", "--batch-size", default=32, type=int)
parser.add_argument("--lr", "--learning-rate", default=0.05, type=float, dest="lr")
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("--seed", default=0, type=int, help="seed for initializing training")
parser.add_argument("--dummy", action="store_true", help="use fake data to benchmark")
parser.add_argument("--dummy-images", default=1024, type=int, help="size of the fake data")


def small_net(num_classes):
    return nn.Sequential(
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
        nn.Linear(64, num_classes),
    )


def accuracy(output, target):
    """Top-1 accuracy of a batch, in percent."""
    with torch.no_grad():
        return (output.argmax(1) == target).float().mean().item() * 100


def train(train_loader, model, criterion, optimizer, device, record):
    model.train()
    for images, target in train_loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        accuracy(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record.append(loss.item())


def main():
    args = parser.parse_args()
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    if args.dummy:
        train_dataset = datasets.FakeData(args.dummy_images, (3, 64, 64), 10, transforms.ToTensor())
    else:
        traindir = os.path.join(args.data, "train")
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        train_dataset = datasets.ImageFolder(
            traindir,
            transforms.Compose(
                [
                    transforms.RandomResizedCrop(64),
                    transforms.RandomHorizontalFlip(),
                    transforms.ToTensor(),
                    normalize,
                ]
            ),
        )
    num_classes = train_dataset.num_classes if args.dummy else len(train_dataset.classes)
    model = small_net(num_classes).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )

    train_sampler = None
    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=(train_sampler is None),
        num_workers=args.workers,
        pin_memory=True,
        sampler=train_sampler,
    )

    losses, epoch_s, cpu0 = [], [], time.process_time()
    for _epoch in range(args.epochs):
        t0 = time.perf_counter()
        train(train_loader, model, criterion, optimizer, device, losses)
        epoch_s.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    print("RESULT " + json.dumps({"losses": losses, "epoch_s": epoch_s, "cpu_s": cpu_s}))


if __name__ == "__main__":
    main()
