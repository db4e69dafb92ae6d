"""The datasets of the swap cells that no other benchmark uses: text, numpy crops, paths.

A cell is a kind of dataset a user's script might hand to a DataLoader (``swap.py``'s
docstring lists them); the ones shared with other benchmarks live in ``dataloader.py``,
these here. Each does its work in ``__getitem__`` in plain Python or numpy, as a user's
does, and all sit at module level so torch's forked workers see them. The text is made-up
(a Zipf-Mandelbrot distribution over syllable words) so no corpus is needed.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import torch
from torch.utils.data import Dataset

_SYLLABLES = (
    "ka to ri an el mo su ne ver tion pre ing al de co mi ra lu sta ble ex im pro "
    "con ter for ment ly ous ish"
).split()
_WORD = re.compile(r"\w+|[^\w\s]")
PAD, UNK, CLS, SEP = 0, 1, 2, 3


def _synthetic_words(rng: random.Random, count: int) -> list[str]:
    """Made-up words of 1-4 syllables in a random frequency order (list index = rank)."""
    words = sorted({"".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(count)})
    rng.shuffle(words)
    return words


def _synthetic_text(rng: random.Random, words: list[str], cum_weights: list[float]) -> str:
    """Two to five sentences of Zipf-Mandelbrot distributed words, with capitals, numbers
    and punctuation."""
    sentences = []
    for _ in range(rng.randint(2, 5)):
        picks = rng.choices(words, cum_weights=cum_weights, k=rng.randint(6, 20))
        if rng.random() < 0.3:
            picks.insert(rng.randrange(len(picks)), str(rng.randint(1, 9999)))
        if rng.random() < 0.4:
            picks[rng.randrange(len(picks))] += ","
        sentences.append(" ".join(picks).capitalize() + rng.choice(".!?"))
    return " ".join(sentences)


class TokenizerDataset(Dataset):
    """Text -> a fixed-length LongTensor of token ids, all in pure Python: lowercase, split
    on words and punctuation, vocabulary lookup, greedy longest-match subwords
    (``##piece``) for unknown words, ``[UNK]`` when that fails, pad or truncate."""

    LENGTH = 128

    def __init__(self, n: int, pool: int = 2048, seed: int = 0) -> None:
        rng = random.Random(seed)
        words = _synthetic_words(rng, 6000)
        cum = list(itertools.accumulate(1 / (rank + 10) for rank in range(len(words))))
        self.n = n
        self.texts = [_synthetic_text(rng, words, cum) for _ in range(pool)]
        pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words[:1500]]
        pieces += [p for s in (*_SYLLABLES, *"0123456789") for p in (s, "##" + s)]
        pieces += list(",.!?")
        self.vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}

    def __len__(self) -> int:
        return self.n

    def _subwords(self, word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [UNK]
        return ids

    def __getitem__(self, i: int) -> torch.Tensor:
        ids = [CLS]
        for token in _WORD.findall(self.texts[i % len(self.texts)].lower()):
            known = self.vocab.get(token)
            ids += [known] if known is not None else self._subwords(token)
        ids = ids[: self.LENGTH - 1] + [SEP]
        ids += [PAD] * (self.LENGTH - len(ids))
        return torch.tensor(ids, dtype=torch.long)


class NumpyAugmentDataset(Dataset):
    """A 64x64 crop of a float32 image through a dozen small numpy ops (each one a short
    call that holds the GIL for most of its time)."""

    MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.images = np.random.default_rng(seed).random((8, 96, 96, 3), dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        y, x = (i * 7) % 33, (i * 13) % 33
        out = self.images[i % 8, y : y + 64, x : x + 64]  # crop
        if i % 2:
            out = out[:, ::-1]  # horizontal flip
        out = out * np.float32(0.8 + 0.1 * (i % 5))  # contrast
        out += np.float32(0.02 * (i % 3 - 1))  # brightness
        gray = out.mean(axis=2, keepdims=True)
        out = gray + (out - gray) * np.float32(1.1)  # saturation
        np.clip(out, 0.0, 1.0, out=out)
        np.power(out, np.float32(0.9), out=out)  # gamma
        out -= self.MEAN
        out /= self.STD
        out = np.ascontiguousarray(out.transpose(2, 0, 1))  # HWC -> CHW
        return torch.from_numpy(out)


class PathDataset(Dataset):
    """Path strings in a list, as an ImageNet-style file index holds them."""

    def __init__(self, n: int) -> None:
        self.paths = [f"/data/imagenet/train/n{i % 1000:08d}/img_{i:08d}.JPEG" for i in range(n)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> str:
        return self.paths[i]


def image_folder(root: str) -> Dataset:
    """The JPEG folder through torchvision's ``ImageFolder``: PIL ``Resize`` to 224x224,
    then ``PILToTensor``."""
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    tf = transforms.Compose([transforms.Resize((224, 224)), transforms.PILToTensor()])
    return ImageFolder(root, transform=tf)
