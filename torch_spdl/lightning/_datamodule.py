"""``StagedDataModule``: a LightningDataModule whose loaders are staged torch_spdl pipelines."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence, Sized
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import Dataset, DistributedSampler, IterableDataset

from ..data import DataLoader, Stage, StagedDataset
from ..source import DistributedRandomSampler, WeightedMix
from ._rank_states import (
    LightningMixedSampler,
    elastic_target,
    gather_states,
    other_world,
    same_shape,
)

__all__ = ["FunctionDataset", "LightningDistributedRandomSampler", "StagedDataModule"]


class FunctionDataset(StagedDataset):
    """A :class:`~torch_spdl.StagedDataset` made of functions: sample ``i`` is
    ``process(load(keys[i]))``. ``load`` (I/O) may be ``async def``; ``process`` (CPU) is
    optional. ``keys`` is any sequence (paths, URLs, ids) or an int ``n`` for ``range(n)``."""

    def __init__(
        self,
        keys: Sequence[Any] | int,
        load: Callable[[Any], Any],
        process: Callable[[Any], Any] | None = None,
    ) -> None:
        self.keys = range(keys) if isinstance(keys, int) else keys
        self.load_fn = load
        self.process_fn = process

    def __len__(self) -> int:
        return len(self.keys)

    def load(self, index: int) -> Any:
        return self.load_fn(self.keys[index])

    async def _load_async(self, index: int) -> Any:
        return await self.load_fn(self.keys[index])

    def process(self, raw: Any) -> Any:
        return raw if self.process_fn is None else self.process_fn(raw)

    def stages(self) -> list[Stage]:
        load = self._load_async if inspect.iscoroutinefunction(self.load_fn) else self.load
        steps = [Stage(load, "io", name="load")]
        if self.process_fn is not None:
            steps.append(Stage(self.process, "cpu", name="process"))
        return steps


class _EpochLoader(DataLoader):
    """The training loader. For an iterable dataset with ``set_epoch`` (a
    ``torch_spdl.streaming.StreamingDataset``, a ``MixedIterableDataset``): Lightning sets
    the epoch on a loader's sampler, which an iterable dataset does not have, so each
    ``iter()`` sets the Trainer's current epoch on the dataset first. After a resume on
    another world size (``elastic``), the loader's own saved state, which Lightning
    restores too, is set aside: it counts batches of the old shares."""

    epoch_of: Callable[[], int] | None = None
    elastic = False

    def __iter__(self) -> Any:
        if self.epoch_of is not None:
            self.dataset.set_epoch(self.epoch_of())  # type: ignore[attr-defined]
        return super().__iter__()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.elastic:
            super().load_state_dict(state)


# DistributedSampler is a base only for Lightning's isinstance check: its __init__ never
# runs and its attributes are not ours, so its plain ``shuffle`` and ``num_replicas``
# attributes are knowingly shadowed by DistributedRandomSampler's shuffle and a read-only
# num_replicas (mypy reports both as incompatible overrides).
class LightningDistributedRandomSampler(  # type: ignore[misc]
    DistributedRandomSampler, DistributedSampler
):
    """:class:`~torch_spdl.source.DistributedRandomSampler` that Lightning recognises as
    already distributed.

    Lightning wraps every sampler that is not a ``DistributedSampler`` in its own
    ``DistributedSamplerWrapper`` when the Trainer is distributed, which would shard the
    already sharded indices a second time. This class only adds the ``isinstance`` answer and
    the ``num_replicas`` name Lightning reads; sampling is ``DistributedRandomSampler``'s.
    """

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return self.world_size


class StagedDataModule(pl.LightningDataModule):
    """A DataModule for staged datasets, with resumable loaders.

    Pass the datasets (any map-style dataset; a :class:`~torch_spdl.StagedDataset` gets its
    ``load`` / ``process`` stages run with ``io_concurrency`` / ``cpu_concurrency``), or build
    them from functions with :meth:`from_functions`. Subclasses may instead assign
    ``self.train_dataset`` (and ``val_dataset``, ``test_dataset``, ``predict_dataset``) in
    ``setup()``.

    Training is shuffled by a :class:`LightningDistributedRandomSampler` (``seed``; a new
    order each epoch through Lightning's ``set_epoch``), which shards by the Trainer's rank
    when distributed. Validation, test and predict keep index order (Lightning adds its
    ``DistributedSampler`` to them under DDP, as for any DataLoader). The DataModule's
    ``state_dict`` holds the training loader's resumable state, counted in batches the model
    received (Lightning does not fetch ahead of ``training_step`` on a loader with a length),
    so resuming from a mid-epoch checkpoint delivers exactly the rest of the epoch.

    ``seed_everything(workers=True)`` works as under torch: Lightning's worker seeding runs
    in the worker processes (and is skipped in worker threads, whose reseeding would be
    process-wide; see ``docs/lightning.md``).
    Other keyword arguments go to every :class:`torch_spdl.DataLoader`.
    """

    def __init__(
        self,
        train: Dataset | None = None,
        val: Dataset | None = None,
        test: Dataset | None = None,
        predict: Dataset | None = None,
        *,
        batch_size: int = 32,
        io_concurrency: int = 8,
        cpu_concurrency: int = 2,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        self.train_dataset = train
        self.val_dataset = val
        self.test_dataset = test
        self.predict_dataset = predict
        self.batch_size = batch_size
        self.io_concurrency = io_concurrency
        self.cpu_concurrency = cpu_concurrency
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.collate_fn = collate_fn
        self.worker_init_fn = worker_init_fn
        self.loader_kwargs = loader_kwargs
        self._train_loader: DataLoader | None = None
        self._pending_state: dict[str, Any] | None = None
        if type(self).setup is pl.LightningDataModule.setup:  # datasets are final now
            for split in ("val", "test", "predict"):
                if getattr(self, f"{split}_dataset") is None:
                    # Lightning then treats the hook as not defined and skips the stage,
                    # instead of warning about a loader of length zero.
                    hook = f"{split}_dataloader"
                    setattr(self, hook, getattr(super(), hook))

    @classmethod
    def from_functions(
        cls,
        load: Callable[[Any], Any],
        process: Callable[[Any], Any] | None = None,
        *,
        train: Sequence[Any] | int | None = None,
        val: Sequence[Any] | int | None = None,
        test: Sequence[Any] | int | None = None,
        predict: Sequence[Any] | int | None = None,
        **kwargs: Any,
    ) -> StagedDataModule:
        """Each split is a sequence of keys (or a count); sample = ``process(load(key))``."""

        def dataset(keys: Sequence[Any] | int | None) -> FunctionDataset | None:
            return None if keys is None else FunctionDataset(keys, load, process)

        return cls(
            train=dataset(train),
            val=dataset(val),
            test=dataset(test),
            predict=dataset(predict),
            **kwargs,
        )

    # -- loaders ---------------------------------------------------------------------------
    def _loader(
        self, dataset: Dataset | None, loader_class: type = DataLoader, **kwargs: Any
    ) -> Any:
        if dataset is None:  # Lightning reads an empty list as "no such loader"
            return []
        return loader_class(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.cpu_concurrency,  # the workers running the CPU stage
            io_concurrency=self.io_concurrency,
            cpu_concurrency=self.cpu_concurrency,
            collate_fn=self.collate_fn,
            worker_init_fn=self.worker_init_fn,
            in_order=True,
            **{**self.loader_kwargs, **kwargs},
        )

    def _rank_and_world(self) -> tuple[int | None, int | None]:
        trainer = getattr(self, "trainer", None)  # None until attached to a Trainer
        if trainer is None:
            return None, None  # DistributedRandomSampler detects them
        return trainer.global_rank, trainer.world_size

    def train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no train dataset")
        if isinstance(dataset, IterableDataset):
            return self._iterable_train_loader(dataset)
        if not isinstance(dataset, Sized):
            raise TypeError(
                f"{type(self).__name__}: the train dataset {dataset!r} has no length; "
                "the training sampler needs a map-style dataset with __len__"
            )
        rank, world = self._rank_and_world()
        sampler: DistributedRandomSampler | LightningMixedSampler
        if isinstance(dataset, WeightedMix):  # the mix's own seed and shuffles
            sampler = LightningMixedSampler(
                dataset, rank=rank, world_size=world, drop_last=self.drop_last
            )
        else:
            sampler = LightningDistributedRandomSampler(
                len(dataset),
                rank=rank,
                world_size=world,
                seed=self.seed,
                drop_last=self.drop_last,
                shuffle=self.shuffle,
            )
        # torch_spdl.DataLoader itself, unless a resume on another world size must set
        # aside the loader state Lightning restores after this (``_EpochLoader``)
        pending = self._pending_state
        elastic = pending is not None and other_world(pending, sampler.world_size)
        loader = self._loader(dataset, _EpochLoader if elastic else DataLoader, sampler=sampler)
        return self._resumed(loader)

    def _resumed(self, loader: DataLoader) -> DataLoader:
        """The training loader, with the state loaded before it existed applied."""
        self._train_loader = loader
        if self._pending_state is not None:
            self._apply(loader, self._pending_state)
            self._pending_state = None
        return loader

    def _apply(self, loader: DataLoader, state: dict[str, Any]) -> None:
        """Resume ``loader``: at the saved shape from its own state, else from every
        rank's elastic state (docs/mixing.md)."""
        states = state.get("elastic")
        target = elastic_target(loader)
        if states and target is not None and not same_shape(states, loader):
            target.load_state_dict(states)
            if isinstance(loader, _EpochLoader):
                loader.elastic = True
        elif "train_loader" in state:
            loader.load_state_dict(state["train_loader"])

    def _iterable_train_loader(self, dataset: IterableDataset) -> DataLoader:
        """An iterable dataset (a stream) shards and shuffles itself: no sampler; the
        epoch goes to its ``set_epoch``, the loader's state holds its position."""
        loader = self._loader(dataset, _EpochLoader)
        trainer = getattr(self, "trainer", None)
        if trainer is not None and callable(getattr(dataset, "set_epoch", None)):
            loader.epoch_of = lambda: trainer.current_epoch
        return self._resumed(loader)

    def val_dataloader(self) -> Any:
        return self._loader(self.val_dataset)

    def test_dataloader(self) -> Any:
        return self._loader(self.test_dataset)

    def predict_dataloader(self) -> Any:
        return self._loader(self.predict_dataset)

    # -- resumable state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (batches the model received this epoch) and,
        for an elastic sampler or mix, every rank's elastic state (gathered from all
        ranks under ``torch.distributed``: call it on every rank, as Lightning does)."""
        if self._train_loader is None:
            return {}
        state: dict[str, Any] = {"train_loader": self._train_loader.state_dict()}
        states = gather_states(self._train_loader)
        if states is not None:
            state["elastic"] = states
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume: the next training loader (or the current one) continues where it was,
        on the same or another number of ranks (docs/mixing.md)."""
        if "train_loader" not in state_dict and "elastic" not in state_dict:
            return
        if self._train_loader is not None:
            self._apply(self._train_loader, state_dict)
        else:
            self._pending_state = dict(state_dict)

    def teardown(self, stage: str) -> None:
        if self._train_loader is not None and stage == "fit":
            self._train_loader.shutdown()
