"""This process's rank and the world size: given, or detected from ``torch.distributed``
or the environment torchrun and Lightning set (``RANK``, ``WORLD_SIZE``)."""

from __future__ import annotations

import os

__all__ = ["detect_rank_and_world_size", "resolve_rank_and_world_size"]


def detect_rank_and_world_size() -> tuple[int, int]:
    """Rank and world size from ``torch.distributed`` if initialised, else ``RANK`` /
    ``WORLD_SIZE`` (as set by torchrun and Lightning), else a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve_rank_and_world_size(
    rank: int | None = None, world_size: int | None = None
) -> tuple[int, int]:
    """``rank`` and ``world_size`` where given, else detected; raises if they disagree.

    Args:
        rank: this process's rank, or None to detect it.
        world_size: the number of ranks, or None to detect it.

    Raises:
        ValueError: when ``world_size < 1`` or ``rank`` is not in ``[0, world_size)``.
    """
    detected_rank, detected_world = detect_rank_and_world_size()
    rank = detected_rank if rank is None else rank
    world = detected_world if world_size is None else world_size
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"invalid rank {rank} for world_size {world}")
    return rank, world
