"""Loading one batch in one go: what a worker (a process, or a thread given whole batches)
does with the indices of a batch, as torch's fetcher does.

A dataset with ``__getitems__`` gets the whole batch of indices at once, as under torch.
Otherwise each sample is loaded on its own, and a sample that fails does not stop the
others: the caller decides, with the loader's failure budget, whether the batch can go on
without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._worker import hidden_worker_info

__all__ = ["Fetched", "fetch_batch"]

_WHO = "torch_spdl.DataLoader"


class Fetched:
    """A loaded batch: ``batch`` when every sample loaded and collated; otherwise the
    ``samples`` that loaded, as ``(position, sample)``, and the ``errors`` as
    ``(position, index, exception)``. Position ``-1`` is an error of the whole batch
    (``collate_fn`` or ``__getitems__`` failed)."""

    __slots__ = ("batch", "samples", "errors")

    def __init__(
        self,
        batch: Any = None,
        samples: list[tuple[int, Any]] | None = None,
        errors: list[tuple[int, Any, BaseException]] | None = None,
    ) -> None:
        self.batch = batch
        self.samples = samples
        self.errors = errors


def fetch_batch(
    dataset: Any,
    values: list[Any],
    indices: list[Any],
    steps: Sequence[Callable[[Any], Any]] | None,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
) -> Fetched:
    """Run ``steps`` on each of ``values`` (``dataset[value]`` when ``steps`` is None),
    then ``collate_fn`` on the batch (on the one sample without auto-collation)."""
    getitems = getattr(dataset, "__getitems__", None) if steps is None else None
    samples: list[Any] = []
    errors: list[tuple[int, Any, BaseException]] = []
    if getitems and auto_collation:
        try:
            samples = list(getitems(values))
        except Exception as exc:
            exc.add_note(f"{_WHO}: '__getitems__' failed on the batch of indices {indices!r}")
            return Fetched(samples=[], errors=[(-1, indices, exc)])
    else:
        for pos, value in enumerate(values):
            name = "getitem"
            try:
                if steps is None:
                    value = dataset[value]
                else:
                    for fn in steps:
                        name = getattr(fn, "__name__", "stage")
                        value = fn(value)
            except Exception as exc:
                exc.add_note(f"{_WHO}: stage {name!r} failed on sample index {indices[pos]!r}")
                errors.append((pos, indices[pos], exc))
                continue
            samples.append(value)
    if errors:
        failed = {pos for pos, _, _ in errors}
        good = [pos for pos in range(len(values)) if pos not in failed]
        return Fetched(samples=list(zip(good, samples, strict=True)), errors=errors)
    try:
        with hidden_worker_info():
            return Fetched(batch=collate_fn(samples if auto_collation else samples[0]))
    except Exception as exc:
        exc.add_note(f"{_WHO}: stage 'collate' failed on the batch of indices {indices!r}")
        return Fetched(samples=[], errors=[(-1, indices, exc)])
