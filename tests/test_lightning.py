"""Lightning integration: plain DataModules with torch_spdl.DataLoader, StagedDataModule,
DDP sharding (gloo, CPU), mid-epoch resume through ``ckpt_path``, seeding and warnings."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings

import pytest
from _sync import CHILD_S

pl = pytest.importorskip("lightning.pytorch")

from _lightning_helpers import (  # noqa: E402
    Crash,
    CrashAtStep,
    PlainDataModule,
    Recorder,
    StagedIndexData,
    ddp_main,
    load_index,
    process_index,
    read_ranks,
)
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from torch_spdl import DataLoader  # noqa: E402
from torch_spdl.lightning import LightningDistributedRandomSampler, StagedDataModule  # noqa: E402

N = 40
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def trainer(**kwargs):
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        **kwargs,
    )


def staged_dm(**kwargs):
    half = StagedIndexData(N // 2)
    return StagedDataModule(
        StagedIndexData(N), val=half, test=half, predict=half, batch_size=4, **kwargs
    )


def functions_dm(**kwargs):
    return StagedDataModule.from_functions(
        load_index, process_index, train=N, val=N // 2, test=N // 2, predict=N // 2,
        batch_size=4, **kwargs,
    )  # fmt: skip


MODULES = {"plain": PlainDataModule, "staged": staged_dm, "functions": functions_dm}


@pytest.mark.parametrize("kind", list(MODULES))
def test_fit_validate_test_predict(kind):
    pl.seed_everything(0)
    model, dm = Recorder(), MODULES[kind]()
    t = trainer(max_epochs=2, num_sanity_val_steps=0)
    t.fit(model, dm)
    assert isinstance(t.train_dataloader, DataLoader)
    train = model.seen["train"]
    assert sorted(train[0]) == sorted(train[1]) == list(range(N))  # every sample once
    assert train[0] != train[1]  # reshuffled
    assert model.seen["val"][0] == list(range(N // 2)) * 2  # once per epoch, in order
    model.seen.clear()
    t.validate(model, dm)
    t.test(model, dm)
    preds = t.predict(model, dm)
    for stage in ("val", "test"):
        assert model.seen[stage][0] == list(range(N // 2))
    assert preds and set(model.seen["predict"][0]) <= set(range(N // 2))


@pytest.mark.parametrize("kind", ["plain", "staged"])
def test_predict_sees_every_sample_once(kind):
    model = Recorder()
    preds = trainer().predict(model, MODULES[kind]())
    assert [int(i) for p in preds for i in p] == list(range(N // 2))


def test_staged_datamodule_without_val_skips_it():
    model = Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(max_epochs=1).fit(model, StagedDataModule(StagedIndexData(N), batch_size=4))
    assert "val" not in model.seen and sorted(model.seen["train"][0]) == list(range(N))
    assert not [w for w in caught if "length" in str(w.message)]


@pytest.mark.parametrize("kind", ["plain", "staged"])
def test_mid_epoch_resume_with_ckpt_path(kind, tmp_path):
    """Crash after 5 of 10 steps, resume from the step-3 checkpoint: the resumed epoch
    delivers exactly the batches after the first 3, and the next epoch is as uninterrupted."""
    make = MODULES[kind]
    pl.seed_everything(1)
    ref = Recorder()
    trainer(max_epochs=2).fit(ref, make())

    pl.seed_everything(1)
    crashed = Recorder()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    with pytest.raises(Crash):
        t = trainer(max_epochs=2, callbacks=[ckpt, CrashAtStep(5)], enable_checkpointing=True)
        t.fit(crashed, make())
    assert crashed.seen["train"][0] == ref.seen["train"][0][:20]  # 5 batches of 4

    resumed = Recorder()
    trainer(max_epochs=2).fit(resumed, make(), ckpt_path=str(tmp_path / "epoch=0-step=3.ckpt"))
    assert resumed.seen["train"][0] == ref.seen["train"][0][12:]  # exactly the rest
    assert resumed.seen["train"][1] == ref.seen["train"][1]


def test_datamodule_state_dict_is_the_loader_state():
    dm = StagedDataModule(StagedIndexData(N), batch_size=4)
    assert dm.state_dict() == {}
    loader = dm.train_dataloader()
    it = iter(loader)
    first = [next(it)["idx"].tolist() for _ in range(3)]
    state = dm.state_dict()
    assert state["train_loader"]["delivered"] == 3
    rest = [b["idx"].tolist() for b in it]

    dm2 = StagedDataModule(StagedIndexData(N), batch_size=4)
    dm2.load_state_dict(state)  # before the loader exists, as Lightning restores it
    assert [b["idx"].tolist() for b in dm2.train_dataloader()] == rest
    assert sorted(sum(first + rest, [])) == list(range(N))


@pytest.mark.parametrize("kind", ["plain", "staged"])
def test_seed_everything_workers_true(kind, monkeypatch):
    """workers=True: Lightning attaches its pl_worker_init_function (which reseeds the
    process-wide RNGs); the loader does not run it in worker threads, so two seeded runs
    are identical and every sample is seen."""
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    runs = []
    for _ in range(2):
        pl.seed_everything(7, workers=True)
        model = Recorder()
        t = trainer(max_epochs=2)
        t.fit(model, staged_dm() if kind == "staged" else PlainDataModule())
        assert "pl_worker_init_function" in repr(t.train_dataloader.worker_init_fn)
        assert sorted(model.seen["train"][0]) == list(range(N))
        runs.append((model.seen["train"], model.losses))
    assert runs[0] == runs[1]


def test_worker_count_warning(monkeypatch):
    """Lightning warns about "not many workers" from num_workers < 2 (on machines where it
    suggests more than one). StagedDataModule sets num_workers to its CPU-stage threads."""
    from lightning.pytorch.trainer.connectors import data_connector

    monkeypatch.setattr(data_connector, "suggested_max_num_workers", lambda _: 8)

    def warned(dm):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer(max_epochs=1, num_sanity_val_steps=0).fit(Recorder(), dm)
        return [str(w.message) for w in caught if "does not have many workers" in str(w.message)]

    assert warned(staged_dm()) == []
    plain = warned(PlainDataModule(num_workers=0))
    assert plain and "'train_dataloader'" in plain[0]


def _check_ddp(records, sampler):
    assert [r["world_size"] for r in records] == [2, 2]
    for r in records:
        assert r["seen"]["classes"]["loader"] == "torch_spdl.DataLoader"
        assert r["seen"]["classes"]["sampler"] == sampler
    for epoch in ("0", "1"):
        a, b = (r["seen"]["train"][epoch] for r in records)
        assert not set(a) & set(b)  # disjoint shards
        assert sorted(a + b) == list(range(N))  # together: every sample exactly once
    for r in records:
        assert r["seen"]["train"]["0"] != r["seen"]["train"]["1"]  # new order next epoch


def test_ddp_spawn_plain_loader_gets_distributed_sampler(tmp_path):
    ddp_main("plain", str(tmp_path), strategy="ddp_spawn")
    _check_ddp(read_ranks(str(tmp_path), "plain", 2), "DistributedSampler")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ddp_staged_datamodule_uses_distributed_random_sampler(tmp_path):
    """strategy="ddp" re-launches the running script per rank, so it runs as a script."""
    script = os.path.join(TESTS_DIR, "_lightning_helpers.py")
    # A port of its own (two suites on one machine must not meet at one rendezvous), and
    # Python's fault handler on, so that a crash of a rank shows where every thread was
    # (this test once ended with SIGABRT and nothing on stderr, on a machine running two
    # suites at once).
    env = {
        **os.environ,
        "PYTHONPATH": os.path.dirname(TESTS_DIR),
        "MASTER_PORT": str(free_port()),
        "PYTHONFAULTHANDLER": "1",
    }
    proc = subprocess.run(
        [sys.executable, script, "staged", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_ddp(read_ranks(str(tmp_path), "staged", 2), LightningDistributedRandomSampler.__name__)


def test_plain_loader_class_survives_lightning_reinstantiation():
    """Lightning re-creates the loader for predict (type(loader)(...)): ours stays ours."""
    t = trainer()
    t.predict(Recorder(), PlainDataModule())
    assert type(t.predict_dataloaders) is DataLoader
