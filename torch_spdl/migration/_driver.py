"""Files in, diffs and reports out: reading, checking, migrating and (optionally) writing.

Nothing is written unless asked (``write=True``). A file that is not Python source, does
not parse, whose migrated text would not compile, or on which the tool itself fails (an
unexpected exception) is reported and left untouched; the other files are still done.

Writing replaces a file with a new one (a temporary file renamed over it), which the
kernel allows whenever the directory is writable: a read-only file would be replaced, and
the new file would belong to whoever ran the tool. So the tool checks first, and refuses
(an error for that file, the others still done) a file the user may not write, one
without its owner's write bit, and one whose owner or group the new file could not be
given; it keeps the mode bits. A refusal, a failure or a signal (Ctrl-C, SIGTERM, SIGHUP)
while writing leaves no temporary file.
"""

from __future__ import annotations

import ast
import contextlib
import grp
import io
import logging
import os
import pwd
import signal
import stat
import tempfile
import threading
import tokenize
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

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


class _Refused(Exception):
    """The file is not written: the user may not, or its owner would change."""


def _refusal(target: Path, st: os.stat_result) -> str | None:
    """Why the user should not replace ``target``, if they should not.

    A file without its owner's write bit is read-only on purpose (``chmod a-w``), and is
    refused even where the user could override that (root, for whom ``os.access`` says
    yes to everything): the write goes through a new file and a rename, which no mode bit
    of the file stops. Then the file itself must be writable by the user, as for an
    in-place write, and its directory too, for the new file and the rename; all checked
    before anything is created.
    """
    if not st.st_mode & stat.S_IWUSR:
        return (
            f"read-only (mode {stat.filemode(st.st_mode)}): its owner has no write "
            "permission; make it writable (chmod u+w) to migrate it"
        )
    effective = os.access in os.supports_effective_ids
    if not os.access(target, os.W_OK, effective_ids=effective):
        return "permission denied: you may not write it"
    if not os.access(target.parent, os.W_OK | os.X_OK, effective_ids=effective):
        return (
            f"permission denied on its directory {target.parent}, where the new text is "
            "written first to replace the file atomically"
        )
    return None


def _who(st: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"user {user}, group {group}"


def _keep_owner(fd: int, st: os.stat_result) -> None:
    """Give the new file (``fd``) the old one's owner and group, or refuse: replacing a
    file must not hand it to whoever ran the tool."""
    new = os.fstat(fd)
    if (new.st_uid, new.st_gid) == (st.st_uid, st.st_gid):
        return
    try:
        os.fchown(fd, st.st_uid, st.st_gid)
    except PermissionError:
        raise _Refused(
            f"owned by {_who(st)}: its replacement would belong to {_who(new)}; run as "
            "its owner to migrate it"
        ) from None


# Signals that end a Python process by default and may come while a file is replaced:
# Ctrl-C (KeyboardInterrupt), kill (SIGTERM), a closed terminal.
_HELD = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the signals of ``_HELD`` while a file is replaced; deliver them afterwards.

    Between the temporary file's creation and the rename (or its removal on failure) a
    signal's default action would end the process and leave the temporary file behind;
    held, it ends the process once the file is replaced or the temporary file removed,
    as it would have. Only the main thread can set handlers; elsewhere nothing is held.
    A handler set outside Python (``getsignal`` gives ``None``) is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    for sig in _HELD:
        if signal.getsignal(sig) is not None:
            previous[sig] = signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)  # the previous handler's action, now


def _write(path: Path, text: str, encoding: str) -> None:
    """Replace the file atomically, keeping its encoding, mode, owner and group, or refuse
    (:class:`_Refused`) where the user may not write it or its owner would change. A
    symbolic link is followed: its target is replaced and the link kept. The temporary
    file (``.NAME.*.tmp`` beside it) is removed on any failure, and signals that would
    end the process wait until it is gone or renamed (:func:`_signals_held`)."""
    target = path.resolve(strict=True)
    st = target.stat()
    reason = _refusal(target, st)
    if reason is not None:
        raise _Refused(reason)
    data = text.encode(encoding)
    with _signals_held():
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                _keep_owner(fd, st)
                os.fchmod(fd, st.st_mode & 0o7777)  # after chown, which clears set-id bits
                f.write(data)
                f.flush()
                os.fsync(fd)
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
        except _Refused as exc:
            result.status = "error"
            result.error = f"not written: {exc}"
            return result
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
