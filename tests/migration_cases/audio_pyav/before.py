"""Audio clips (WAV and FLAC) decoded with PyAV, cut to a fixed length."""

import io
from pathlib import Path

import av
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class AudioDataset(Dataset):
    """Files named ``<id>_<label>.<ext>``; each sample is (1 x clip_samples waveform, label)."""

    def __init__(self, root, clip_samples=4000):
        self.files = sorted(p for p in Path(root).iterdir() if p.suffix in (".wav", ".flac"))
        self.clip_samples = clip_samples

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        path = self.files[index]
        data = path.read_bytes()
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            chunks = [frame.to_ndarray() for frame in container.decode(stream)]
        waveform = np.concatenate(chunks, axis=1).astype(np.float32) / 32768.0  # from s16
        waveform = waveform[:, : self.clip_samples]
        pad = self.clip_samples - waveform.shape[1]
        waveform = np.pad(waveform, ((0, 0), (0, pad)))
        label = int(path.stem.split("_")[1])
        return torch.from_numpy(waveform), label


def make_loader(root, num_workers=2):
    return DataLoader(AudioDataset(root), batch_size=2, num_workers=num_workers)
