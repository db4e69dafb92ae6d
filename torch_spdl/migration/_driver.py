"""Files in, diffs and reports out: reading, checking, migrating and (optionally) writing.

Nothing is written unless asked (``write=True``). A file that is not Python source, does
not parse, whose migrated text would not compile, or on which the tool itself fails (an
unexpected exception) is reported and left untouched; the other files are still done.
"""

from __future__ import annotations

import ast
import io
import logging
import os
import tempfile
import tokenize
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import libcst as cst

from ._report import FileResult
from ._transform import migrate_module

__all__ = ["iter_python_files", "migrate_file", "migrate_paths", "migrate_source"]

_LG = logging.getLogger("torch_spdl.migration")
_SKIP_DIRS = frozenset({"__pycache__", "site-packages", "node_modules"})


def migrate_source(source: str, path: str = "<string>") -> FileResult:
    """Migrate Python source text; never touches the file system."""
    try:
        compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        where = f"line {exc.lineno}, column {exc.offset}" if exc.lineno else "unknown place"
        return FileResult(path, "error", error=f"does not parse: {exc.msg} ({where})")
    except ValueError as exc:  # e.g. null bytes
        return FileResult(path, "error", error=f"not Python source: {exc}")
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return FileResult(
            path,
            "error",
            error=f"does not parse: {exc.message} (line {exc.raw_line}, column {exc.raw_column})",
        )
    new, decisions = migrate_module(module)
    migrated = new.code
    try:
        compile(migrated, path, "exec", dont_inherit=True)
    except SyntaxError as exc:  # a bug of the tool: never write such a result
        _LG.error("migrated %s does not compile: %s", path, exc)
        return FileResult(
            path,
            "error",
            decisions,
            error=f"internal error: the migrated text does not compile ({exc.msg}, line "
            f"{exc.lineno}); please report it",
            original=source,
        )
    status: Literal["changed", "unchanged"] = "changed" if migrated != source else "unchanged"
    return FileResult(path, status, decisions, original=source, migrated=migrated)


def _decode(data: bytes) -> tuple[str, str]:
    """The text of a source file and its encoding, as Python decodes it (PEP 263);
    ValueError if it is not text."""
    if b"\0" in data:
        raise ValueError("not a Python source file (binary content)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise ValueError(f"not a Python source file: cannot decode it as text ({exc})") from None


def _write(path: Path, text: str, encoding: str) -> None:
    """Replace the file atomically, keeping its encoding and permissions. A symbolic link
    is followed: its target is replaced and the link kept."""
    target = path.resolve(strict=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode(encoding))
        os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _internal_error(shown: str, exc: Exception) -> FileResult:
    """A bug of the tool on one file: reported for that file, which is left untouched."""
    _LG.debug("internal error while migrating %s", shown, exc_info=exc)
    return FileResult(
        shown, "error", error=f"internal error while migrating {shown}: {type(exc).__name__}: {exc}"
    )


def migrate_file(path: Path, write: bool = False, display: str | None = None) -> FileResult:
    """Migrate one file; write it back only when ``write`` and something changed."""
    shown = display or str(path)
    if path.suffix != ".py":
        return FileResult(
            shown, "error", error=f"not a Python file (expected a .py name, got {path.name!r})"
        )
    try:
        text, encoding = _decode(path.read_bytes())
    except OSError as exc:
        return FileResult(shown, "error", error=f"cannot read: {exc.strerror or exc}")
    except ValueError as exc:
        return FileResult(shown, "error", error=str(exc))
    try:
        result = migrate_source(text, shown)
    except Exception as exc:  # a bug of the tool: this file fails, the others go on
        return _internal_error(shown, exc)
    if write and result.status == "changed" and result.migrated is not None:
        try:
            _write(path, result.migrated, encoding)
        except OSError as exc:
            result.status = "error"
            result.error = f"cannot write: {exc.strerror or exc}"
            return result
        except Exception as exc:  # a bug of the tool; the temporary file is removed
            return _internal_error(shown, exc)
        result.written = True
    return result


def iter_python_files(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[Path, str | None]]:
    """(file, error) for each path: directories expand to their ``*.py`` files (hidden and
    ``__pycache__``/``site-packages`` directories skipped); a missing path is an error."""
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
                out += [(Path(root) / f, None) for f in sorted(files) if f.endswith(".py")]
        elif path.exists():
            out.append((path, None))
        else:
            out.append((path, "no such file or directory"))
    return out


def migrate_paths(paths: Iterable[str | os.PathLike[str]], write: bool = False) -> list[FileResult]:
    """Migrate every Python file under ``paths`` (files or directories)."""
    results = []
    for path, error in iter_python_files(paths):
        if error is not None:
            results.append(FileResult(str(path), "error", error=error))
            continue
        try:
            results.append(migrate_file(path, write=write))
        except Exception as exc:  # a bug of the tool: this file fails, the others go on
            results.append(_internal_error(str(path), exc))
    return results
