"""What runs in a DataLoader worker that is a Ray actor (``worker_type="ray"``).

A :class:`LoaderActor` is one of torch's worker processes, placed by Ray anywhere in the
cluster: it is worker ``wid`` of ``num_workers``, seeded as torch seeds its workers
(``random`` and torch with ``base_seed + wid``, NumPy from both), ``get_worker_info()``
answers in it (torch's and ours), ``worker_init_fn`` runs in it once, and it loads and
collates whole batches as torch's worker does (``_loading.fetch.fetch_batch``, or an
``IterableDataset``'s next batch). Ray runs an actor's calls one at a time, in the order
one caller made them, so its batches are made in torch's order and its random draws are
those of torch's worker ``wid``.

Two things are added for the loader's side (``ray_workers``):

- Each reply carries the state of the actor's global RNGs (``random``, NumPy's, torch's)
  after the batch. When the actor dies, a replacement seeded the same way restores the
  state after the last batch the loader received and makes the batches that were lost:
  bit-identical to what the dead actor would have made, for a dataset whose randomness
  comes from those RNGs (torchvision's transforms, ``random``, ``np.random``), which is
  torch's contract for reproducible workers anyway.
- A :class:`~torch_spdl.data.StagedDataset` runs its stages here, per batch, as in a
  worker process (``_loading/staged_batch.py``): ``io`` stages on the actor's threads
  (``io_threads`` samples at once), ``cpu`` stages one sample after another on the
  actor's thread, so their random draws keep torch's order.

The dataset, ``collate_fn`` and ``worker_init_fn`` arrive pickled once (cloudpickle, as
Ray pickles functions: a dataset defined in ``__main__`` works), in one object of the
object store that every actor reads. A batch goes back packed (``torch_spdl._ray.pack``):
its tensors as out-of-band arrays the trainer views without a copy.
"""

from __future__ import annotations

import pickle
import random
from typing import Any, NamedTuple

import numpy as np
import torch

from ..._procwire import PortableError
from ..._ray import pack
from .._loading.fetch import Fetched, IterableFetcher, fetch_batch
from .._loading.staged_batch import StagedBatch
from .._loading.worker_info import install_torch_worker_info, set_process_worker_info

__all__ = ["LoaderActor", "Reply", "RngState", "SampleFailure"]

# random's, NumPy's and torch's states, pickled: as bytes they travel inside the reply's
# own bytes, where NumPy's array would be a view of the batch's object in the store, and
# the loader, which keeps the latest, would keep every batch's object alive with it.
RngState = bytes


class SampleFailure(NamedTuple):
    pos: int  # -1: the whole batch (collate_fn, __getitems__, the iterator)
    index: Any
    error: PortableError


class Reply(NamedTuple):
    """What one call made: the batch (or the samples that loaded) packed, the failures,
    the RNGs after it, a stateful dataset's state, and whether an iterable worker ended."""

    data: bytes
    arrays: list[np.ndarray]
    failures: list[SampleFailure] | None
    rng: RngState
    state: Any = None
    exhausted: bool = False
    #: An iterable worker's first batch of an epoch: its RNGs as the epoch's stream began.
    epoch_rng: RngState | None = None


def _rng_state() -> RngState:
    return pickle.dumps((random.getstate(), np.random.get_state(), torch.get_rng_state()))


def _set_rng_state(pickled: RngState) -> None:
    state = pickle.loads(pickled)
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


class LoaderActor:
    """One DataLoader worker as a Ray actor (see the module notes).

    Args:
        wid: the worker id.
        num_workers: how many workers the loader has.
        base_seed: worker ``wid`` is seeded with ``base_seed + wid``.
        blob: the cloudpickled ``(dataset, collate_fn, worker_init_fn)``.
        auto_collation: torch's automatic batching.
        iterable: an ``IterableDataset``'s ``(batch_size, drop_last)``, or None.
        io_threads: a staged dataset's ``io`` stages run this many samples at once.
        io_threads_first: start them on the threads (the user set ``io_concurrency``),
            else inline until they wait.
    """

    def __init__(
        self,
        wid: int,
        num_workers: int,
        base_seed: int,
        blob: bytes,
        auto_collation: bool,
        iterable: tuple[int | None, bool] | None,
        io_threads: int,
        io_threads_first: bool = False,
    ) -> None:
        self._wid = wid
        self._num_workers = num_workers
        self._base_seed = base_seed
        self._blob = blob
        self._auto_collation = auto_collation
        self._iterable = iterable
        self._io_threads = io_threads
        self._io_threads_first = io_threads_first
        self._fetcher: IterableFetcher | None = None
        self._staged: StagedBatch | None = None
        self._epoch: int | None = None
        self._init_error: Exception | None = None

    def start(self, rng: RngState | None) -> PortableError | None:
        """Become worker ``wid`` (then, for a replacement, restore ``rng``); the error of
        the dataset's unpickling or of ``worker_init_fn``, if any."""
        from ray import cloudpickle

        try:
            self._dataset, self._collate_fn, init_fn = cloudpickle.loads(self._blob)
            del self._blob
            install_torch_worker_info()  # this process is the loader's: collate sees no worker
            set_process_worker_info(self._wid, self._num_workers, self._base_seed, self._dataset)
            if init_fn is not None:
                init_fn(self._wid)
            self._staged = StagedBatch.of(
                self._dataset, self._io_threads, threads_first=self._io_threads_first
            )
        except Exception as exc:
            self._init_error = exc
            return PortableError.of(exc)
        if rng is not None:
            _set_rng_state(rng)
        return None

    def ready(self) -> int:
        return self._wid

    def load(self, indices: list[Any]) -> Reply:
        """Load and collate the batch of ``indices`` (one index without auto-collation)."""
        self._check_started()
        dataset = self._dataset
        values, steps = indices, None
        if self._staged is not None:  # its io stages on this actor's threads
            values, steps = self._staged.load(indices, indices), self._staged.cpu_steps
        collate, auto = self._collate_fn, self._auto_collation
        fetched = fetch_batch(dataset, values, indices, steps, collate, auto)
        return self._reply(fetched, indices)

    def next_batch(self, epoch: int, state: Any) -> Reply:
        """An ``IterableDataset``'s next batch of ``epoch`` (a new epoch starts a new
        iterator; ``state``: a stateful dataset's, restored first)."""
        self._check_started()
        if self._fetcher is None:
            assert self._iterable is not None, "an iterable task for a map-style worker"
            per_batch, drop_last = self._iterable
            self._fetcher = IterableFetcher(
                self._dataset, per_batch, drop_last, self._collate_fn, self._auto_collation
            )
        began = _rng_state() if epoch != self._epoch else None
        self._epoch = epoch
        fetched = self._fetcher.next(epoch, state)
        if fetched is None:
            return Reply(b"", [], None, _rng_state(), exhausted=True, epoch_rng=began)
        reply = self._reply(fetched, None)
        if fetched.errors is not None and callable(getattr(self._dataset, "state_dict", None)):
            # past the failed one; pickled, as the RNGs are
            reply = reply._replace(state=pickle.dumps(self._dataset.state_dict()))
        return reply._replace(epoch_rng=began)

    def _check_started(self) -> None:
        if self._init_error is not None:  # a replacement whose start failed
            raise RuntimeError(
                f"worker {self._wid}'s Ray actor could not start: {self._init_error!r}"
            ) from self._init_error

    def _reply(self, fetched: Fetched, indices: Any) -> Reply:
        try:
            return _packed(fetched)
        except Exception as exc:
            what = "a batch" if indices is None else f"the batch of samples {indices!r}"
            exc.add_note(
                f"torch_spdl.DataLoader: {what} could not be sent back from its Ray actor: "
                "what collate_fn returns must pickle"
            )
            return _packed(Fetched(samples=[], errors=[(-1, indices, exc)]))


def _packed(fetched: Fetched) -> Reply:
    rng = _rng_state()
    if fetched.errors is None:
        data, arrays = pack(fetched.batch)
        state = None if fetched.state is None else pickle.dumps(fetched.state)  # as the RNGs
        return Reply(data, arrays, None, rng, state)
    failures = [SampleFailure(pos, index, PortableError.of(e)) for pos, index, e in fetched.errors]
    data, arrays = pack(fetched.samples)
    return Reply(data, arrays, failures, rng)
