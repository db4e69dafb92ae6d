"""Video clips stored as numbered frames; each frame is read and transformed in one loop.

Reading and transforming are interleaved in the loop, so the tool cannot separate them:
it keeps ``__getitem__`` as one stage and says why (torch_spdl still runs it on threads).
"""

import os

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms
from torch_spdl import DataLoader


class ClipDataset(Dataset):
    def __init__(self, root, num_clips, clip_len=3):
        self.root = root
        self.num_clips = num_clips
        self.clip_len = clip_len
        self.to_tensor = transforms.PILToTensor()

    def __len__(self):
        return self.num_clips

    def __getitem__(self, index):
        frames = []
        for t in range(self.clip_len):
            path = os.path.join(self.root, f"clip{index:03d}_{t}.png")
            frame = Image.open(path).convert("L")
            frames.append(self.to_tensor(frame))
        return torch.stack(frames)


def make_loader(root, num_clips, num_workers=2):
    dataset = ClipDataset(root, num_clips)
    return DataLoader(dataset, batch_size=2, num_workers=num_workers)
