"""The shapes of sources SPDL code passes around, as runtime-checkable protocols.

``spdl.source`` names two: an iterable that can be reshuffled per epoch, and an iterable
with a length. They are protocols, not base classes, so any object with the methods fits
(our samplers included) without inheriting from anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["EpochStream", "IterableWithShuffle", "SizedIterable"]

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class IterableWithShuffle(Protocol[T_co]):
    """An iterable whose order is set by ``shuffle(seed=...)`` (call it once per epoch)."""

    def shuffle(self, seed: int) -> None:
        """Reorder the items for the next iteration, deterministically from ``seed``."""
        ...

    def __iter__(self) -> Iterator[T_co]: ...


@runtime_checkable
class SizedIterable(Protocol[T_co]):
    """An iterable that knows how many items it yields."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[T_co]: ...


@runtime_checkable
class EpochStream(Protocol[T_co]):
    """A stream that :class:`~torch_spdl.source.MixedStreams` can mix: an iterable that
    deals itself to ranks and loader workers (each consumer iterates only its own share,
    as ``torch_spdl.streaming.StreamingDataset`` and
    :class:`~torch_spdl.source.MixedIterableDataset` do) and takes the epoch from
    ``set_epoch``. With ``state_dict`` / ``load_state_dict`` as well (torch's *Stateful*
    protocol), a mix of such streams resumes mid-epoch."""

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch`` for the next iteration."""
        ...

    def __iter__(self) -> Iterator[T_co]: ...
