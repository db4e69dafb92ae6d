"""The migration tool (``torch-spdl migrate``): the before/after cases in tests/migration_cases,
the split rules, the command line and bad input."""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _migration_cases import CASES, EXPECTED, assert_same, load_module, make_data
from _sync import CHILD_S

import torch_spdl
from torch_spdl import StagedDataset
from torch_spdl.migration import migrate_source, render_text

ROOT = Path(__file__).resolve().parent.parent
CASE_NAMES = sorted(EXPECTED)
SPLIT = ["load (io)", "process (cpu)"]


def _ruff() -> str | None:
    return shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


# -- the cases ---------------------------------------------------------------------------------
def test_every_case_is_listed() -> None:
    dirs = sorted(p.name for p in CASES.iterdir() if (p / "before.py").exists())
    assert dirs == CASE_NAMES
    assert len(dirs) >= 12


@pytest.mark.parametrize("case", CASE_NAMES)
def test_tool_produces_the_committed_after(case: str) -> None:
    before = (CASES / case / "before.py").read_text()
    result = migrate_source(before, f"{case}/before.py")
    assert result.status == "changed", result.error
    assert result.migrated == (CASES / case / "after.py").read_text(), (
        "after.py is stale: regenerate it (see docs/migration.md, Regenerating)"
    )
    expected = EXPECTED[case]
    assert result.splits() == {k: v for k, v in expected.items() if v is not None}
    assert set(result.kept()) == {k for k, v in expected.items() if v is None}
    again = migrate_source(result.migrated)
    assert again.status == "unchanged" and again.migrated == result.migrated  # idempotent


def test_after_files_are_formatted_and_lint_clean() -> None:
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed")
    after = [str(CASES / c / "after.py") for c in CASE_NAMES]
    fmt = subprocess.run([ruff, "format", "--check", "--diff", *after], capture_output=True)
    assert fmt.returncode == 0, fmt.stdout.decode()[-3000:]
    lint = subprocess.run(
        [ruff, "check", "--no-cache", "--select", "F,E,W,B,UP", *after], capture_output=True
    )
    assert lint.returncode == 0, lint.stdout.decode()[-3000:]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_migrated_case_yields_the_same_batches(case: str, tmp_path: Path) -> None:
    """The original through torch's DataLoader, the migrated module through torch_spdl's
    (threads; the staged datasets run load and process as stages): the same batches in the
    same order, and the same samples by plain indexing."""
    if case == "hdf5_lazy":
        pytest.importorskip("h5py")
    with contextlib.ExitStack() as stack:
        kwargs, loaders, torch_workers = make_data(case, tmp_path, stack)
        before = load_module(CASES / case / "before.py", f"_migration_{case}_before")
        after = load_module(CASES / case / "after.py", f"_migration_{case}_after")
        for factory, workers in loaders.items():
            theirs = getattr(before, factory)(**kwargs, num_workers=torch_workers)
            ours = getattr(after, factory)(**kwargs, num_workers=workers)
            assert type(theirs) is torch.utils.data.DataLoader
            assert isinstance(ours, torch_spdl.DataLoader)
            dataset = ours.dataset
            staged = EXPECTED[case][type(dataset).__name__] is not None
            assert isinstance(dataset, StagedDataset) == staged
            try:
                expected = list(theirs)
                got = list(ours)
            finally:
                ours.shutdown()
            assert len(got) == len(expected) > 0
            assert_same(got, expected)
            for i in range(len(dataset)):  # __getitem__ still composes load and process
                torch.manual_seed(i)  # the same global draws for random transforms
                mine = dataset[i]
                torch.manual_seed(i)
                assert_same(mine, theirs.dataset[i], f"sample {i}")


# -- the rules, on small sources ---------------------------------------------------------------
HEAD = """\
from PIL import Image
from torch.utils.data import Dataset


"""


def _migrate(body: str, head: str = HEAD):
    return migrate_source(head + textwrap.dedent(body))


def _kept_reason(body: str, head: str = HEAD) -> str:
    result = _migrate(body, head)
    (reason,) = result.kept().values()
    assert "StagedDataset" not in result.migrated
    return reason


def test_split_passes_the_live_values_and_keeps_comments() -> None:
    result = _migrate(
        """\
        class Images(Dataset):
            def __getitem__(self, i):
                \"\"\"Sample i.\"\"\"
                path = self.paths[i]   # odd   spacing kept
                img = Image.open(path)
                img = img.convert("L")  # CPU
                return img, self.labels[i]
        """
    )
    assert result.splits() == {"Images": SPLIT}
    code = result.migrated
    assert "class Images(StagedDataset, Dataset):" in code
    assert '"""Sample i."""\n        return self.process(self.load(i))' in code
    assert "path = self.paths[i]   # odd   spacing kept" in code
    assert "        return img, i\n" in code and "        img, i = raw\n" in code
    assert "from torch_spdl import StagedDataset" in code


@pytest.mark.parametrize(
    "body, reason",
    [
        (
            """\
            class D(Dataset):
                def __getitem__(self, i):
                    data = open(self.paths[i], "rb").read()
                    if not data:
                        return None
                    more = open(self.other[i], "rb").read()
                    return data + more.upper()
            """,
            "early return",
        ),
        (
            """\
            import random

            class D(Dataset):
                def __getitem__(self, i):
                    angle = random.random() * 10
                    img = Image.open(self.paths[i])
                    return img.rotate(angle)
            """,
            "shared random generator",
        ),
        (
            """\
            import torch

            class D(Dataset):
                def __getitem__(self, i):
                    noise = torch.rand(3)
                    img = Image.open(self.paths[i])
                    return img, noise
            """,
            "shared random generator",
        ),
        (
            """\
            from torchvision import transforms as T

            class D(Dataset):
                def __init__(self):
                    self.aug = T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])

                def __getitem__(self, i):
                    img = self.aug(Image.open(self.paths[i]))
                    return img.sum()
            """,
            "shared random generator",
        ),
        (
            """\
            class D(Dataset):
                def __getitem__(self, i):
                    if i in self.cache:
                        img = self.cache[i]
                    img = Image.open(self.paths[i]) if i % 2 else self.blank
                    self.cache[i] = img.convert("L")
                    return self.cache[i]
            """,
            "self.cache",
        ),
        (
            """\
            class D(Dataset):
                def __getitem__(self, i):
                    if self.flag:
                        name = self.names[i]
                    data = open(self.paths[i], "rb").read()
                    return data.upper(), name
            """,
            "only on some paths",
        ),
        (
            """\
            class D(Dataset):
                def __getitem__(self, i):
                    return self.transform(Image.open(self.paths[i]))
            """,
            "same statement",
        ),
        (
            """\
            class D(Dataset):
                def __getitem__(self, i):
                    return self.paths[i].upper()
            """,
            "no I/O recognised",
        ),
        (
            """\
            class D(Dataset):
                async def __getitem__(self, i):
                    data = open(self.paths[i], "rb").read()
                    return data.upper()
            """,
            "async",
        ),
        (
            """\
            class D(Dataset):
                def __getitem__(self, i):
                    out = [Image.open(p).convert("L") for p in self.paths[i]]
                    return out
            """,
            "loop",
        ),
        (
            """\
            class D(Dataset):
                def load(self, i):
                    return i

                def __getitem__(self, i):
                    data = open(self.paths[i], "rb").read()
                    return data.upper()
            """,
            "already defines load",
        ),
    ],
)
def test_unsafe_splits_keep_one_stage(body: str, reason: str) -> None:
    assert reason in _kept_reason(body)


def test_per_sample_generators_and_in_memory_buffers() -> None:
    result = _migrate(
        """\
        import io

        import numpy as np
        import torch

        class D(Dataset):
            def _read(self, path):
                with open(path, "rb") as f:
                    return f.read()

            def __getitem__(self, i):
                data = self._read(self.paths[i])
                rng = np.random.default_rng((7, i))
                g = torch.Generator().manual_seed(i)
                img = Image.open(io.BytesIO(data))
                return img.rotate(rng.random()), torch.rand(2, generator=g)
        """
    )
    assert result.splits() == {"D": SPLIT}
    assert "def process(self, data):" not in result.migrated  # data, i are passed
    assert "        i, data = raw\n" in result.migrated


def test_dataloader_rewrites_and_flags() -> None:
    result = migrate_source(
        textwrap.dedent(
            """\
            import torch.utils.data as tud
            from torch.utils.data import DataLoader as DL, get_worker_info

            def seed(worker_id):
                info = get_worker_info()

            a = tud.DataLoader(ds, 8, True, num_workers=4, worker_init_fn=seed)
            b = DL(ds, prefetch_factor=2, num_workers=2, multiprocessing_context="spawn")
            """
        )
    )
    code = result.migrated
    assert "a = torch_spdl.DataLoader(ds, 8, True, num_workers=4, worker_init_fn=seed)" in code
    assert "from torch.utils.data import get_worker_info\n" in code
    assert "from torch_spdl import DataLoader as DL\n" in code
    assert "import torch_spdl\n" in code
    messages = "\n".join(d.message for d in result.decisions)
    # workers are worker processes, as torch's: these arguments mean what they mean there,
    # and get_worker_info() answers in them
    for same in ("num_workers", "worker_init_fn", "prefetch_factor", "multiprocessing_context"):
        assert same not in messages
    assert "get_worker_info" not in messages
    assert migrate_source(code).status == "unchanged"


@pytest.mark.parametrize(
    ("source", "swap"),
    [
        (
            "from timm.data import create_loader\n\nloader = create_loader(ds, (3, 224, 224))\n",
            "torch.utils.data.DataLoader = torch_spdl.DataLoader",
        ),
        (
            "import lightning as L\n\ndm = L.LightningDataModule.from_datasets(train)\n",
            "lightning.pytorch.core.datamodule.DataLoader = torch_spdl.DataLoader",
        ),
        (
            "from transformers import Trainer\n\ntrainer = Trainer(model=m, train_dataset=ds)\n",
            "transformers.trainer.DataLoader = torch_spdl.DataLoader",
        ),
    ],
)
def test_loaders_built_inside_libraries_are_reported_with_the_line_that_swaps_them(
    source: str, swap: str
) -> None:
    result = migrate_source(source)
    assert result.status == "unchanged"  # nothing in the file to rewrite
    library = [d for d in result.decisions if d.kind == "library"]
    assert len(library) == 1 and library[0].line == 3
    assert swap in library[0].message and "out of reach of the import swap" in library[0].message
    report = render_text([result])
    assert "1 loader(s) built inside libraries" in report


def test_a_random_draw_after_the_reads_is_split_and_runs_in_the_workers() -> None:
    result = _migrate(
        """\
        from torchvision import transforms as T

        class D(Dataset):
            def __init__(self):
                self.aug = T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])

            def __getitem__(self, i):
                img = Image.open(self.paths[i])
                return self.aug(img)
        """
    )
    assert result.splits() == {"D": ["load (io)", "process (cpu)"]}
    notes = "\n".join(d.message for d in result.decisions)
    assert "runs in the worker processes, seeded and ordered as torch's" in notes
    assert "worker_type='thread' would make the draws depend on timing" in notes


def test_left_alone_with_a_reason() -> None:
    result = _migrate(
        """\
        from torch.utils.data import IterableDataset

        class Stream(IterableDataset):
            def __iter__(self):
                yield 1

        class Table:
            def __getitem__(self, i):
                return open(self.paths[i]).read()

        class Derived(Table):
            def __getitem__(self, i):
                return 1
        """
    )
    assert result.status == "unchanged"
    skipped = [d.message for d in result.decisions if d.kind == "skipped"]
    assert any("IterableDataset" in m for m in skipped)
    assert any("Derived: not a direct subclass" in m for m in skipped)


# -- command line ------------------------------------------------------------------------------
def _cli(*args: str, script: bool = False) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "torch-spdl"
    cmd = [str(exe)] if script else [sys.executable, "-m", "torch_spdl"]
    return subprocess.run([*cmd, "migrate", *args], capture_output=True, text=True, timeout=CHILD_S)


def test_cli_dry_run_then_write(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    shutil.copy(CASES / "image_folder" / "before.py", path)
    original = path.read_bytes()
    dry = _cli(str(tmp_path))
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith(f"--- a/{path}\n+++ b/{path}\n")
    assert "+class ImageFolderDataset(StagedDataset, Dataset):" in dry.stdout
    assert "split: class ImageFolderDataset" in dry.stderr and "dry run" in dry.stderr
    assert path.read_bytes() == original  # nothing written without --write

    if not (Path(sys.executable).parent / "torch-spdl").exists():
        pytest.skip("the torch-spdl script is not installed (pip install -e .)")
    report = tmp_path / "report.json"
    wrote = _cli("--write", "--report-json", str(report), str(path), script=True)
    assert wrote.returncode == 0, wrote.stderr
    assert path.read_text() == (CASES / "image_folder" / "after.py").read_text()
    (entry,) = json.loads(report.read_text())
    assert entry["status"] == "changed" and entry["written"]
    assert any(d["stages"] == SPLIT for d in entry["decisions"])
    again = _cli("--write", str(path), script=True)
    assert again.returncode == 0 and "0 to change, 1 unchanged" in again.stderr


def test_bad_input_is_reported_and_left_untouched(tmp_path: Path) -> None:
    files = {
        "notes.txt": b"from torch.utils.data import DataLoader\n",
        "broken.py": b"from torch.utils.data import DataLoader\ndef f(:\n",
        "binary.py": b"\x00\x01\x02DataLoader",
        "latin.py": b"x = '\xe9'\n",
        "good.py": b"from torch.utils.data import DataLoader\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [str(tmp_path / n) for n in files] + [str(tmp_path / "missing.py")]
    for args in ([], ["--write"]):
        done = _cli(*args, *paths)
        assert done.returncode == 1
        err = done.stderr
        assert "notes.txt: error: not a Python file" in err
        assert "broken.py: error: does not parse" in err and "line 2" in err
        assert "binary.py: error: not a Python source file (binary content)" in err
        assert "latin.py: error: not a Python source file: cannot decode" in err
        assert "missing.py: error: no such file or directory" in err
        for name, data in files.items():
            if name != "good.py":
                assert (tmp_path / name).read_bytes() == data
    assert (tmp_path / "good.py").read_text() == "from torch_spdl import DataLoader\n"


# -- regressions -------------------------------------------------------------------------------
def _exec(code: str) -> dict[str, object]:
    """Run migrated module text as a module would be imported; its namespace."""
    namespace: dict[str, object] = {"__name__": "_migrated"}
    exec(compile(code, "<migrated>", "exec"), namespace)
    return namespace


def test_plain_and_aliased_dataloader_imports_in_one_module() -> None:
    result = migrate_source(
        textwrap.dedent(
            """\
            from torch.utils.data import DataLoader, Dataset

            def make(ds):
                from torch.utils.data import DataLoader as DL, Dataset as D
                return DL(ds), DataLoader(ds), D
            """
        )
    )
    assert result.status == "changed", result.error
    code = result.migrated
    assert "from torch_spdl import DataLoader, DataLoader as DL\n" in code
    assert "    from torch.utils.data import Dataset as D\n" in code
    loader, other, base = _exec(code)["make"]([1, 2, 3])  # type: ignore[operator]
    assert isinstance(loader, torch_spdl.DataLoader) and isinstance(other, torch_spdl.DataLoader)
    assert base is torch.utils.data.Dataset
    assert migrate_source(code).status == "unchanged"


def test_an_internal_error_fails_only_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import libcst

    from torch_spdl.migration import migrate_paths

    real = libcst.parse_module

    def buggy(source, *args, **kwargs):  # a bug on the tool's path, on one file only
        if "BOOM" in source:
            raise TypeError("'<' not supported between instances of 'NoneType' and 'str'")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(libcst, "parse_module", buggy)
    bad, good = tmp_path / "a_bad.py", tmp_path / "b_good.py"
    bad.write_text("from torch.utils.data import DataLoader  # BOOM\n")
    good.write_text("from torch.utils.data import DataLoader\n")
    results = migrate_paths([tmp_path], write=True)
    assert [r.status for r in results] == ["error", "changed"]
    assert results[0].error == (
        f"internal error while migrating {bad}: TypeError: '<' not supported between "
        "instances of 'NoneType' and 'str'"
    )
    assert bad.read_text() == "from torch.utils.data import DataLoader  # BOOM\n"
    assert good.read_text() == "from torch_spdl import DataLoader\n"
    good.write_text("from torch.utils.data import DataLoader\n")
    # The command line (``python -m torch_spdl``, run here in this process) exits with 1.
    monkeypatch.setattr(sys, "argv", ["torch-spdl", "migrate", "--quiet", "--write", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("torch_spdl", run_name="__main__")
    assert exited.value.code == 1
    assert good.read_text() == "from torch_spdl import DataLoader\n"


def test_new_imports_precede_module_level_uses() -> None:
    result = migrate_source(
        textwrap.dedent(
            '''\
            """A module with a late import."""

            import torch.utils.data
            from torch.utils.data import Dataset

            LOADER = torch.utils.data.DataLoader


            class Blobs(Dataset):
                def __init__(self, paths):
                    self.paths = paths

                def __getitem__(self, i):
                    data = open(self.paths[i], "rb").read()
                    return data.upper()


            import os  # noqa: E402

            SEP = os.sep
            '''
        )
    )
    assert result.splits() == {"Blobs": SPLIT}
    code = result.migrated
    assert "from torch.utils.data import Dataset\nimport torch_spdl\n" in code
    namespace = _exec(code)  # NameError when the imports come after the uses
    assert namespace["LOADER"] is torch_spdl.DataLoader
    assert issubclass(namespace["Blobs"], StagedDataset)  # type: ignore[arg-type]
    assert migrate_source(code).status == "unchanged"


def test_new_imports_follow_environment_set_up_before_torch() -> None:
    code = migrate_source(
        textwrap.dedent(
            """\
            import os

            os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported

            import torch
            from torch.utils.data import DataLoader, Dataset

            def make(ds):
                from torch.utils.data import DataLoader as DL
                return DL(ds), DataLoader(ds), torch, Dataset
            """
        )
    ).migrated
    assert code.index("os.environ") < code.index("import torch\n") < code.index("torch_spdl")
    assert "from torch.utils.data import Dataset\nfrom torch_spdl import DataLoader\n\ndef" in code
    assert isinstance(_exec(code)["make"]([1])[0], torch_spdl.DataLoader)  # type: ignore[index,operator]
    only_in_function = migrate_source(
        '"""Doc."""\n\nX = 1\n\n\ndef f():\n'
        "    from torch.utils.data import DataLoader as DL, Dataset\n"
        "    return DL, Dataset\n"
    ).migrated
    assert only_in_function.startswith('"""Doc."""\n\nfrom torch_spdl import DataLoader as DL\n\nX')


BASE = """\
class Base(Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __getitem__(self, i):
        data = open(self.paths[i], "rb").read()
        return data.upper()
"""


@pytest.mark.parametrize(
    "child, overrides",
    [
        (
            """\
            class Child(Base):
                def __getitem__(self, i):
                    return super().__getitem__(i).lower()
            """,
            "Child overrides __getitem__",
        ),
        (
            """\
            class Child(Base):
                def process(self, text):
                    return text.strip()
            """,
            "Child overrides process",
        ),
        (
            """\
            class Middle(Base):
                pass

            class Leaf(Middle):
                def __getitem__(self, i):
                    return b""
            """,
            "Leaf overrides __getitem__",
        ),
    ],
)
def test_a_base_whose_subclass_overrides_getitem_stays_whole(child: str, overrides: str) -> None:
    reason = _kept_reason(BASE + "\n\n" + textwrap.dedent(child))
    assert reason.startswith("class Base: kept one stage")
    assert overrides in reason


def test_a_base_with_a_plain_subclass_is_still_split() -> None:
    result = _migrate(BASE + "\n\nclass Child(Base):\n    def extra(self):\n        return 1\n")
    assert result.splits() == {"Base": SPLIT}


class _Split(StagedDataset):
    """The shape the tool writes: __getitem__, load and process in one class."""

    def __getitem__(self, index: int):
        return self.process(self.load(index))

    def load(self, index: int):
        return index * 10

    def process(self, raw):
        return raw + 1

    def __len__(self) -> int:
        return 6


class _Overrides(_Split):  # e.g. in another module, which the tool cannot see
    def __getitem__(self, index: int):
        return -super().__getitem__(index)


class _HandWritten(StagedDataset):
    def load(self, index: int):
        return index * 10

    def __len__(self) -> int:
        return 6


class _CallsSuper(_HandWritten):
    def __getitem__(self, index: int):
        return super().__getitem__(index) + 0.5


class _NewProcess(_Split):
    def process(self, raw):
        return raw + 2


def _loaded(dataset: StagedDataset) -> list[float]:
    loader = torch_spdl.DataLoader(dataset, batch_size=3, num_workers=2)
    try:
        return [x for batch in loader for x in batch.tolist()]
    finally:
        loader.shutdown()


def test_loader_runs_a_subclass_getitem_that_overrides_the_stages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for cls in (_Overrides, _CallsSuper):
        dataset = cls()
        assert _loaded(dataset) == [dataset[i] for i in range(6)]
        (stage,) = dataset.stages()
        assert stage.kind == "cpu" and stage.name == "getitem"
    warned = [r for r in caplog.records if "_Overrides overrides __getitem__" in r.getMessage()]
    assert len(warned) == 1  # once per class
    _loaded(_Overrides())
    assert len([r for r in caplog.records if "_Overrides" in r.getMessage()]) == 1
    for cls in (_Split, _NewProcess, _HandWritten):  # consistent: still two stages
        dataset = cls()
        assert [s.name for s in dataset.stages()] == ["load", "process"]
        assert _loaded(dataset) == [dataset[i] for i in range(6)]
    assert _NewProcess()[1] == 12


def test_write_through_a_symlink_migrates_its_target(tmp_path: Path) -> None:
    from torch_spdl.migration import migrate_paths

    real = tmp_path / "real" / "train.py"
    real.parent.mkdir()
    real.write_text("from torch.utils.data import DataLoader\n")
    real.chmod(0o754)
    link = tmp_path / "train.py"
    link.symlink_to(real)
    (result,) = migrate_paths([link], write=True)
    assert result.status == "changed" and result.written
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert real.read_text() == "from torch_spdl import DataLoader\n"
    assert real.stat().st_mode & 0o7777 == 0o754
    assert sorted(p.name for p in real.parent.iterdir()) == ["train.py"]  # no temp left


# -- --write: what it refuses, what it keeps ---------------------------------------------------
_LOADER = "from torch.utils.data import DataLoader\n"
_MIGRATED = "from torch_spdl import DataLoader\n"


def test_write_refuses_a_read_only_file_and_does_the_others(tmp_path: Path) -> None:
    # No write bit for its owner: refused even for root, whom the kernel would let write.
    locked, other = tmp_path / "a_locked.py", tmp_path / "b_other.py"
    for path in (locked, other):
        path.write_text(_LOADER)
    locked.chmod(0o444)
    done = _cli("--write", str(tmp_path))
    assert done.returncode == 1, done.stderr
    assert (
        f"{locked}: error: not written: read-only (mode -r--r--r--): its owner has no write "
        "permission; make it writable (chmod u+w) to migrate it (left untouched)"
    ) in done.stderr
    assert locked.read_text() == _LOADER and locked.stat().st_mode & 0o7777 == 0o444
    assert other.read_text() == _MIGRATED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_locked.py", "b_other.py"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
@pytest.mark.parametrize("mode", [0o640, 0o6750])  # set-id bits: a chown clears them
def test_write_keeps_the_owner_group_and_mode(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "train.py"
    path.write_text(_LOADER)
    os.chown(path, 65534, 65534)  # nobody, nogroup: not whoever runs the tool
    path.chmod(mode)
    done = _cli("--write", str(path))
    assert done.returncode == 0, done.stderr
    assert path.read_text() == _MIGRATED
    st = path.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (65534, 65534, mode)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any directory")
def test_write_refuses_a_file_in_a_directory_it_may_not_write(tmp_path: Path) -> None:
    from torch_spdl.migration import migrate_paths

    folder = tmp_path / "locked"
    folder.mkdir()
    path = folder / "train.py"
    path.write_text(_LOADER)
    folder.chmod(0o555)
    try:
        (result,) = migrate_paths([path], write=True)
    finally:
        folder.chmod(0o755)
    assert result.status == "error" and not result.written
    assert result.error == (
        f"not written: permission denied on its directory {folder.resolve()}, where the new "
        "text is written first to replace the file atomically"
    )
    assert path.read_text() == _LOADER
    assert sorted(p.name for p in folder.iterdir()) == ["train.py"]


# The command line under a file-size limit (RLIMIT_FSIZE) smaller than the migrated text: a
# real failure halfway through writing (Python ignores SIGXFSZ, so the write fails with
# EFBIG). With a signal given, the host process is also sent that signal from its SIGXFSZ
# handler, at that very moment: a kill arriving while the file is being written.
_LIMITED = """\
import os, resource, runpy, signal, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
if sys.argv[1] != "none":
    kill = getattr(signal, sys.argv[1])
    signal.signal(kill, signal.SIG_DFL)  # as in a terminal (under nohup, SIGHUP is ignored)
    signal.signal(signal.SIGXFSZ, lambda *_: os.kill(os.getpid(), kill))
sys.argv = ["torch-spdl", "migrate", "--no-diff", "--write", *sys.argv[2:]]
runpy.run_module("torch_spdl", run_name="__main__")
"""


@pytest.mark.parametrize("kill", ["SIGTERM", "SIGHUP", "none"])
def test_a_write_stopped_midway_leaves_the_file_whole_and_no_temporary_file(
    tmp_path: Path, kill: str
) -> None:
    big, small = tmp_path / "a_big.py", tmp_path / "b_small.py"
    text = _LOADER + "# padding\n" * 1000  # 10 kB: over the limit
    big.write_text(text)
    small.write_text(_LOADER)
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED, kill, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=CHILD_S,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert big.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_big.py", "b_small.py"]
    if kill != "none":  # ended by the signal, once the temporary file was removed
        assert done.returncode == -getattr(signal, kill), done.stderr
        assert small.read_text() == _LOADER  # the run stopped there
    else:  # that file failed; the others are still done
        assert done.returncode == 1, done.stderr
        assert f"{big}: error: cannot write: File too large (left untouched)" in done.stderr
        assert small.read_text() == _MIGRATED


# -- torchvision's folder datasets ---------------------------------------------------------------
def test_torchvision_folder_calls_are_staged_by_name_only_with_the_pil_loader() -> None:
    source = textwrap.dedent(
        """\
        from torchvision.datasets import DatasetFolder, ImageFolder
        from torchvision.datasets.folder import default_loader
        import torchvision


        def mine(path):
            return open(path, "rb").read()


        a = ImageFolder("r", None, None)
        b = DatasetFolder("r", default_loader, (".jpg",))
        c = torchvision.datasets.ImageFolder("r", loader=mine)
        d = ImageFolder(*args)
        e = isinstance(a, torchvision.datasets.ImageFolder)


        class Mine(ImageFolder):
            pass
        """
    )
    result = migrate_source(source)
    lines = result.migrated.splitlines()
    assert lines[3] == "import torch_spdl.vision"  # after the block of imports
    assert 'a = torch_spdl.vision.ImageFolder("r", None, None)' in lines
    assert 'b = torch_spdl.vision.DatasetFolder("r", default_loader, (".jpg",))' in lines
    assert 'c = torchvision.datasets.ImageFolder("r", loader=mine)' in lines
    assert "d = ImageFolder(*args)" in lines
    assert "e = isinstance(a, torchvision.datasets.ImageFolder)" in lines  # names stay
    assert "class Mine(ImageFolder):" in lines
    splits = [d for d in result.decisions if d.kind == "split"]
    assert [(d.line, d.name, d.stages) for d in splits] == [
        (10, "ImageFolder", ["load (io)", "process (cpu)"]),
        (11, "DatasetFolder", ["load (io)", "process (cpu)"]),
    ]
    kept = {d.line: d.message for d in result.decisions if d.kind == "kept"}
    assert "loader=mine is not torchvision's PIL loader" in kept[12]
    assert "through * or **" in kept[13]
    again = migrate_source(result.migrated)
    assert again.status == "unchanged"
