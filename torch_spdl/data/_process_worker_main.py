"""What runs in a DataLoader worker process, and the messages it sends back.

:mod:`._process_workers` (the loader's side) forks the workers; each runs
:func:`worker_main`: it takes tasks (a batch of indices, loaded values, or "the next batch"
of an iterable dataset) from its pipe, loads and collates the batch, writes it into a
shared-memory arena and sends back the batch's small metadata, or the errors, pickled when
they survive pickling (:func:`rebuild_error` makes them again in the loader).
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from ._collate import PlacingCollate, is_default_collate
from ._fetch import Fetched, IterableFetcher, fetch_batch
from ._leases import NO_ARENA
from ._libc import return_large_blocks
from ._shared_batch import Arena, BatchSpace, dump_batch
from ._worker_info import install_torch_worker_info, set_process_worker_info

__all__ = ["ITERATE", "rebuild_error", "worker_main"]

_WATCHDOG_S = 5.0  # how often an idle worker checks that the loader's process still lives
ITERATE = -2
"""The ``split`` of a task that asks an iterable dataset's worker for its next batch."""


def _pack_error(exc: BaseException) -> tuple[bytes | None, str]:
    """The exception itself when it survives a pickle round trip, and its traceback."""
    text = "".join(traceback.format_exception(exc))
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:
        data = None
    return data, text


def rebuild_error(data: bytes | None, text: str) -> BaseException:
    if data is not None:
        exc = pickle.loads(data)
    else:
        exc = RuntimeError(f"an exception that cannot be pickled was raised:\n{text}")
    exc.add_note(f"traceback in the worker process:\n{text}")
    return exc


def worker_main(
    wid: int,
    config: tuple[Any, ...],
    stage_fns: Callable[[Any, int], Sequence[Callable[[Any], Any]]] | None,
    tasks: Connection,
    results: Connection,
    arenas: list[Arena] | None,
    others: list[Connection],
) -> None:
    for conn in others:
        conn.close()
    # The parent's objects are never collected here: no finalizer of theirs runs in the
    # child, and no collection writes to (and so copies) the pages they share with it.
    gc.freeze()
    return_large_blocks()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training loop's to handle
    dataset, num_workers, base_seed, init_fn, collate_fn, auto_collation, iterable = config
    install_torch_worker_info()  # this process is the loader's: collate then sees no worker
    try:
        set_process_worker_info(wid, num_workers, base_seed, dataset)
        if init_fn is not None:
            init_fn(wid)
    except Exception as exc:
        results.send(("init_error", *_pack_error(exc)))
        os._exit(1)
    steps_cache: dict[int, Sequence[Callable[[Any], Any]]] = {}
    fetcher: IterableFetcher | None = None
    parent = os.getppid()
    while True:
        try:
            while not tasks.poll(_WATCHDOG_S):
                if os.getppid() != parent:  # the loader's process is gone
                    os._exit(0)
            task = tasks.recv()
        except (EOFError, OSError):  # the loader's process is gone
            break
        if task is None:
            break
        task_id, slot, split, payload = task
        values, indices = pickle.loads(payload)
        arena = arenas[slot] if arenas is not None and slot != NO_ARENA else None
        if split == ITERATE:
            if fetcher is None:
                assert iterable is not None, "an iterable task for a map-style worker"
                per_batch, drop_last = iterable
                fetcher = IterableFetcher(dataset, per_batch, drop_last, collate_fn, auto_collation)
            epoch, state = values  # state: a stateful dataset's, to restore first
            fetched = fetcher.next(epoch, state)
            if fetched is None:
                results.send(("end", task_id, slot))
            else:
                results.send(_pack(fetched, task_id, slot, arena))
            continue
        if split not in steps_cache and split >= 0 and stage_fns is not None:
            steps_cache[split] = stage_fns(dataset, split)
        steps = steps_cache.get(split) if split >= 0 else None
        results.send(
            _load(
                task_id,
                slot,
                values,
                indices,
                dataset,
                steps,
                collate_fn,
                auto_collation,
                arena,
            )
        )
    os._exit(0)  # no atexit handlers or finalizers of the parent's objects in the child


def _load(
    task_id: int,
    slot: int,
    values: list[Any],
    indices: list[Any],
    dataset: Any,
    steps: Sequence[Callable[[Any], Any]] | None,
    collate_fn: Callable[[Any], Any],
    auto_collation: bool,
    arena: Arena | None,
) -> tuple[Any, ...]:
    space = None
    if arena is not None and auto_collation and is_default_collate(collate_fn):
        # torch's collate, stacking large tensors straight into the batch's arena: the
        # batch is written once, where the loader reads it (no copy after collating)
        space = BatchSpace(arena)
        collate_fn = PlacingCollate(space.empty)
    fetched = fetch_batch(dataset, values, indices, steps, collate_fn, auto_collation)
    return _pack(fetched, task_id, slot, arena, space, indices)


def _pack(
    fetched: Fetched,
    task_id: int,
    slot: int,
    arena: Arena | None,
    space: BatchSpace | None = None,
    indices: Any = None,
) -> tuple[Any, ...]:
    """The reply for a batch: the batch, or, when what it holds does not pickle (a lock, a
    generator, an open file), the error naming its samples, so that the loop sees the cause
    and the worker goes on."""
    try:
        return _dump(fetched, task_id, slot, arena, space)
    except Exception as exc:
        what = "a batch" if indices is None else f"the batch of samples {indices!r}"
        exc.add_note(
            f"torch_spdl.DataLoader: {what} could not be sent back from its worker process: "
            "what collate_fn returns must pickle"
        )
        return _dump(Fetched(samples=[], errors=[(-1, indices, exc)]), task_id, slot, arena)


def _dump(
    fetched: Fetched,
    task_id: int,
    slot: int,
    arena: Arena | None,
    space: BatchSpace | None = None,
) -> tuple[Any, ...]:
    if fetched.errors is None:
        return ("ok", task_id, slot, *dump_batch(fetched.batch, arena, space), fetched.state)
    errors = [(pos, index, *_pack_error(exc)) for pos, index, exc in fetched.errors]
    return ("failed", task_id, slot, *dump_batch(fetched.samples, arena), errors)
