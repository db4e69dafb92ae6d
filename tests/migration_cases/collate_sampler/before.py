"""Variable-length sequences: a length-grouping sampler and a padding collate_fn."""

import random
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler


class SequenceDataset(Dataset):
    def __init__(self, root, scale=0.5):
        self.files = sorted(Path(root).glob("*.npy"))
        self.lengths = [len(np.load(f, mmap_mode="r")) for f in self.files]
        self.scale = scale

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        seq = np.load(self.files[index])
        return torch.from_numpy(seq).float() * self.scale


class LengthGroupedSampler(Sampler[int]):
    """Indices sorted by length within shuffled chunks, so batches need little padding."""

    def __init__(self, lengths, chunk=4, seed=0):
        self.lengths = lengths
        self.chunk = chunk
        self.seed = seed
        self.epoch = 0

    def __iter__(self):
        order = list(range(len(self.lengths)))
        random.Random(self.seed + self.epoch).shuffle(order)
        for start in range(0, len(order), self.chunk):
            chunk = order[start : start + self.chunk]
            yield from sorted(chunk, key=lambda i: self.lengths[i])

    def __len__(self):
        return len(self.lengths)


def pad_collate(batch):
    lengths = torch.tensor([len(x) for x in batch])
    return pad_sequence(batch, batch_first=True), lengths


def seed_worker(worker_id):
    np.random.seed(torch.initial_seed() % 2**32)


def make_loader(root, num_workers=2):
    dataset = SequenceDataset(root)
    return DataLoader(
        dataset,
        batch_size=4,
        sampler=LengthGroupedSampler(dataset.lengths),
        collate_fn=pad_collate,
        num_workers=num_workers,
        worker_init_fn=seed_worker,
        multiprocessing_context="fork" if num_workers else None,
    )
