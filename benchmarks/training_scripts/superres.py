"""A training script in the shape of pytorch/examples' ``super_resolution`` (its
``main.py``, ``model.py``, ``data.py`` and ``dataset.py`` in one file): run by
``benchmarks/real_scripts.py`` as written, with its import swapped, and after
``torch-spdl migrate --write``.

Kept as the public example has it, because it decides what ``migrate`` sees: a
module-level ``load_img`` that opens the file with PIL, converts it to YCbCr and keeps
the Y channel (``.split()``); ``DatasetFromFolder``, a ``torch.utils.data.Dataset``
imported as ``data``, listing its folder with ``listdir`` and, in ``__getitem__``,
loading the image, copying it for the target, then applying the input and target
transforms when given; the transforms built by ``input_transform`` (CenterCrop, Resize
down by the factor, ToTensor) and ``target_transform`` (CenterCrop, ToTensor) on a crop
size made a multiple of the factor; ``DataLoader(dataset=..., num_workers=threads,
batch_size=..., shuffle=True)``; the sub-pixel CNN, Adam and MSE; ``--seed``. Smaller:
96-pixel crops of 160x120 JPEGs and a batch of 16 (the example's BSDS300 crops are 256).
Added: the loss of every step, each epoch's time and this process's CPU time, printed as
one ``RESULT`` line of JSON at the end.
"""

import argparse
import json
import time
from os import listdir
from os.path import join

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data as data
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import CenterCrop, Compose, Resize, ToTensor

# -- the dataset (dataset.py) --------------------------------------------------------------


def is_image_file(filename):
    return any(filename.endswith(ext) for ext in (".png", ".jpg", ".jpeg"))


def load_img(filepath):
    img = Image.open(filepath).convert("YCbCr")
    y, _, _ = img.split()
    return y


class DatasetFromFolder(data.Dataset):
    def __init__(self, image_dir, input_transform=None, target_transform=None):
        super().__init__()
        self.image_filenames = [join(image_dir, x) for x in listdir(image_dir) if is_image_file(x)]
        self.input_transform = input_transform
        self.target_transform = target_transform

    def __getitem__(self, index):
        input = load_img(self.image_filenames[index])
        target = input.copy()
        if self.input_transform:
            input = self.input_transform(input)
        if self.target_transform:
            target = self.target_transform(target)
        return input, target

    def __len__(self):
        return len(self.image_filenames)


# -- the transforms (data.py) --------------------------------------------------------------


def calculate_valid_crop_size(crop_size, upscale_factor):
    return crop_size - (crop_size % upscale_factor)


def input_transform(crop_size, upscale_factor):
    return Compose([CenterCrop(crop_size), Resize(crop_size // upscale_factor), ToTensor()])


def target_transform(crop_size):
    return Compose([CenterCrop(crop_size), ToTensor()])


def get_training_set(root, upscale_factor):
    train_dir = join(root, "BSDS300", "images", "train")
    crop_size = calculate_valid_crop_size(96, upscale_factor)
    return DatasetFromFolder(
        train_dir,
        input_transform=input_transform(crop_size, upscale_factor),
        target_transform=target_transform(crop_size),
    )


# -- the model (model.py) ------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 16, 3, padding=1)
        self.conv4 = nn.Conv2d(16, upscale_factor**2, 3, padding=1)
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


# -- training (main.py) --------------------------------------------------------------------

parser = argparse.ArgumentParser(description="Super resolution, small")
parser.add_argument("data", help="DATA/BSDS300/images/train/*.jpg")
parser.add_argument("--upscale_factor", type=int, default=3)
parser.add_argument("--batchSize", type=int, default=16)  # noqa: N815 (the example's spelling)
parser.add_argument("--nEpochs", type=int, default=5)  # noqa: N815
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--threads", type=int, default=4, help="data loader workers")
parser.add_argument("--seed", type=int, default=123)


def train(model, criterion, optimizer, training_data_loader, device, record):
    epoch_loss = 0.0
    for batch in training_data_loader:
        input, target = batch[0].to(device), batch[1].to(device)
        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.item()
        record.append(loss.item())
        loss.backward()
        optimizer.step()
    return epoch_loss / len(training_data_loader)


def main():
    opt = parser.parse_args()
    torch.manual_seed(opt.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    train_set = get_training_set(opt.data, opt.upscale_factor)
    training_data_loader = DataLoader(
        dataset=train_set, num_workers=opt.threads, batch_size=opt.batchSize, shuffle=True
    )
    model = Net(upscale_factor=opt.upscale_factor).to(device)
    criterion = nn.MSELoss()
    optimizer = optim.Adam(model.parameters(), lr=opt.lr)

    losses, epoch_s, cpu0 = [], [], time.process_time()
    for _epoch in range(1, opt.nEpochs + 1):
        t0 = time.perf_counter()
        train(model, criterion, optimizer, training_data_loader, device, losses)
        epoch_s.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    print("RESULT " + json.dumps({"losses": losses, "epoch_s": epoch_s, "cpu_s": cpu_s}))


if __name__ == "__main__":
    main()
