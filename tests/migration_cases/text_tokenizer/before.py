"""Text files turned into fixed-length token ids by a small word-level tokenizer."""

import re
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset


class WordTokenizer:
    """Lower-cased words; id 0 pads, id 1 is for words not in the vocabulary."""

    def __init__(self, texts, max_vocab=50):
        counts = {}
        for text in texts:
            for word in self.words(text):
                counts[word] = counts.get(word, 0) + 1
        ranked = sorted(counts, key=lambda w: (-counts[w], w))[:max_vocab]
        self.vocab = {word: i + 2 for i, word in enumerate(ranked)}
        self.pad_id = 0

    @staticmethod
    def words(text):
        return re.findall(r"[a-z']+", text.lower())

    def encode(self, text):
        return [self.vocab.get(word, 1) for word in self.words(text)]


class TextDataset(Dataset):
    def __init__(self, files, tokenizer, max_len=12):
        self.files = list(files)
        self.tokenizer = tokenizer
        self.max_len = max_len

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        text = Path(self.files[index]).read_text(encoding="utf-8")
        ids = self.tokenizer.encode(text)[: self.max_len]
        ids = ids + [self.tokenizer.pad_id] * (self.max_len - len(ids))
        return torch.tensor(ids, dtype=torch.long)


def make_loader(root, num_workers=2):
    files = sorted(Path(root).glob("*.txt"))
    tokenizer = WordTokenizer(f.read_text(encoding="utf-8") for f in files)
    return DataLoader(TextDataset(files, tokenizer), batch_size=3, num_workers=num_workers)
