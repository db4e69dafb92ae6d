"""Seeds derived from a run's seed, the epoch and what the draw is for.

Every rank and worker must draw the same order for ``(seed, epoch)`` without talking to
each other, and two draws of one epoch (the interleave, each source's pass) must not
share a stream. A seed is therefore a hash of its parts (BLAKE2b, the same in every
process and on every machine, unlike ``hash()``), fed to a ``torch.Generator`` of its own:
the global RNGs are never touched.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["derive_seed", "generator"]


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that depends on every one of ``parts`` and on their order."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def generator(*parts: int | str) -> torch.Generator:
    """A CPU generator seeded with :func:`derive_seed` of ``parts``."""
    return torch.Generator().manual_seed(derive_seed(*parts))
