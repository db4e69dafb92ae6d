"""A local directory of downloaded shards, bounded by size, shared by the processes of a node.

Every epoch reads the same shards; a copy on local disk makes the later ones disk reads.
The directory is shared by every consumer on the host (the DataLoader workers of every
rank), which are separate processes, so it is kept consistent with files and locks alone:

- **an entry** is a shard's bytes (``<name>.shard``), what they were copied from
  (``<name>.json``: the URL, the object's size and its ETag) and a lock file
  (``<name>.lock``); the copy is used only while the object's size and ETag are still those
  recorded and the file has that size, so an object changed on the server, or a copy cut
  short, is fetched again;
- **no torn file**: a shard is downloaded to a temporary name and renamed into place once
  whole; the old record goes before the rename and the new one after it, so no reader ever
  pairs a record with bytes it does not describe;
- **no double download**: a consumer that finds no valid copy takes the entry's lock
  exclusively (without waiting) and downloads; one that finds the lock taken waits for a
  shared lock, that is for the download to end, and then reads the copy. A reader holds the
  shared lock while it reads; nobody ever *waits* for an exclusive lock, so no consumer
  waits on another's reading (which could hang on the training loop's pace);
- **bounded by size, least recently used first**: a hit sets the copy's modification time;
  before a new copy is put in place, the oldest are removed until it fits, each only if
  its lock can be taken exclusively at once (a shard being read, or being downloaded, is
  never removed); a copy that cannot fit is read from its temporary file and dropped.
  The copies in place never exceed the limit; a download in progress is on top of it.

``fcntl.flock`` locks belong to the open file, and the kernel drops them with the process,
so a consumer that dies leaves no lock behind; its temporary file is removed by the next
eviction pass (an entry whose lock is free has no download in progress).

All of it is blocking file-system work: the stream calls it on the event loop's executor.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CacheFill", "CacheLease", "ShardCache"]

_SAFE = re.compile(r"[^A-Za-z0-9_-]+")  # no dot: a file name is <stem>.<kind>


def _flock(fd: int, mode: int) -> bool:
    """``flock(fd, mode)``; False when ``LOCK_NB`` is in ``mode`` and the lock is taken."""
    import fcntl

    try:
        fcntl.flock(fd, mode)
    except BlockingIOError:
        return False
    return True


def _lock_file(path: Path, mode: int) -> int | None:
    """An open descriptor of ``path`` holding a ``flock`` of ``mode`` (None: taken, with
    ``LOCK_NB``). The file may be removed by an eviction while we wait for it: the lock is
    only ours if the path still names the file we locked."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock(fd, mode):
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@dataclass
class _Entry:
    stem: str
    data: Path
    record: Path
    lock: Path


class CacheLease:
    """A shard's bytes to read: an open copy, and the shared lock that keeps it in place
    until :meth:`release` (when the reads are done, or the pipeline stops; the files are
    closed once the reads in flight have returned)."""

    def __init__(
        self, cache: ShardCache, lock_fd: int, data_fd: int, size: int, temp: Path | None
    ) -> None:
        self._cache = cache
        self._lock_fd = lock_fd
        self._data_fd = data_fd
        self.size = size
        self._temp = temp  # a copy that was not put in place: removed on release
        self.chunks = 0  # reads still to come; the last one releases
        self._guard = threading.Lock()
        self._reading = 0
        self._released = False

    def read(self, start: int, end: int) -> bytes:
        with self._guard:
            if self._released:
                raise OSError("the local copy was released while its shard was read")
            self._reading += 1
        try:
            parts, offset = [], start
            while offset < end:
                part = os.pread(self._data_fd, end - offset, offset)
                if not part:
                    break
                parts.append(part)
                offset += len(part)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            with self._guard:
                self._reading -= 1
                last = self._released and not self._reading
            if last:
                self._close()

    def chunk_read(self) -> None:
        self.chunks -= 1
        if self.chunks <= 0:
            self.release()

    def release(self) -> None:
        with self._guard:
            if self._released:
                return
            self._released = True
            idle = not self._reading
        if idle:
            self._close()

    def _close(self) -> None:
        os.close(self._data_fd)
        if self._temp is not None:
            self._temp.unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._cache._forget(self)


class CacheFill:
    """A download in progress into a temporary file, under the entry's exclusive lock.
    Its writes run on executor threads and :meth:`abort` may come from the loop's: a lock
    keeps a descriptor from being closed under a write (or reused by another file)."""

    def __init__(self, cache: ShardCache, entry: _Entry, lock_fd: int, url: str) -> None:
        self._cache = cache
        self.entry = entry
        self.url = url
        self._lock_fd: int | None = lock_fd
        self.temp = entry.data.with_name(f"{entry.stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        self._fd = os.open(self.temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self.written = 0
        self._guard = threading.Lock()

    def _check(self) -> int:
        if self._lock_fd is None:
            raise OSError(f"the download of {self.url} into the cache was abandoned")
        return self._lock_fd

    def write(self, offset: int, data: bytes) -> None:
        with self._guard:
            self._check()
            view = memoryview(data)
            while view:
                n = os.pwrite(self._fd, view, offset)
                view, offset = view[n:], offset + n
            self.written = max(self.written, offset)

    def finish(self, size: int, etag: str | None) -> CacheLease:
        """The download is over: put the copy in place if it is whole and fits, and read it
        (under a shared lock) either way."""
        with self._guard:
            lock_fd = self._check()
            temp: Path | None = self.temp
            if self.written == size and self._cache._put(self, size, etag):
                temp = None
            _flock(lock_fd, _mode("LOCK_SH"))  # readers may come in from here
            self._lock_fd = None
            lease = CacheLease(self._cache, lock_fd, self._fd, self.written, temp)
        self._cache._swap(self, lease)
        return lease

    def abort(self) -> None:
        with self._guard:
            if self._lock_fd is None:
                return
            os.close(self._fd)
            self.temp.unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
        self._cache._forget(self)


def _mode(*names: str) -> int:
    import fcntl

    mode = 0
    for name in names:
        mode |= getattr(fcntl, name)
    return mode


class ShardCache:
    """The shards of ``directory``, at most ``limit`` bytes of them (None: no limit).

    One instance serves one pipeline run; any number of them, in any processes of the
    host, may share a directory. :meth:`close` releases what the run still holds.
    """

    def __init__(self, directory: str | os.PathLike[str], limit: int | None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self._held: set[CacheLease | CacheFill] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _entry(self, url: str) -> _Entry:
        digest = hashlib.sha256(url.encode()).hexdigest()[:20]
        tail = _SAFE.sub("_", url.rsplit("/", 1)[-1])[-48:]
        stem = f"{digest}-{tail}"
        d = self.directory
        return _Entry(stem, d / f"{stem}.shard", d / f"{stem}.json", d / f"{stem}.lock")

    # -- a consumer's view ----------------------------------------------------------------
    def open(
        self, url: str, size: int, etag: str | None, fill: bool
    ) -> CacheLease | CacheFill | None:
        """A lease on a valid copy of ``url`` (``size`` bytes, ``etag``); else, with
        ``fill``, the download to make (this consumer is the one to make it); else None
        (read the object itself: no copy, and someone else's download failed or is of
        another version)."""
        entry = self._entry(url)
        if fill:
            fd = _lock_file(entry.lock, _mode("LOCK_EX", "LOCK_NB"))
            if fd is not None:
                lease = self._valid(entry, fd, url, size, etag, exclusive=True)
                if lease is not None:
                    return lease
                return self._hold(CacheFill(self, entry, fd, url))
        fd = _lock_file(entry.lock, _mode("LOCK_SH"))  # waits for a download to end
        assert fd is not None
        lease = self._valid(entry, fd, url, size, etag, exclusive=False)
        if lease is None:
            os.close(fd)
        return lease

    def _valid(
        self, entry: _Entry, fd: int, url: str, size: int, etag: str | None, exclusive: bool
    ) -> CacheLease | None:
        try:
            record = json.loads(entry.record.read_text())
            data_fd = os.open(entry.data, os.O_RDONLY)
        except (OSError, ValueError):
            return None
        if record != {"url": url, "size": size, "etag": etag} or os.fstat(data_fd).st_size != size:
            os.close(data_fd)
            return None
        if exclusive:
            _flock(fd, _mode("LOCK_SH"))
        os.utime(data_fd)  # the least recently used go first
        return self._hold(CacheLease(self, fd, data_fd, size, None))

    # -- putting a copy in place ----------------------------------------------------------
    def _put(self, fill: CacheFill, size: int, etag: str | None) -> bool:
        """Make room and put ``fill``'s file in place (False: it cannot fit)."""
        if self.limit is not None and size > self.limit:
            return False
        fd = _lock_file(self.directory / ".evict.lock", _mode("LOCK_EX"))
        assert fd is not None
        try:
            if not self._make_room(size, keep=fill.entry.stem):
                return False
            entry = fill.entry
            entry.record.unlink(missing_ok=True)
            os.rename(fill.temp, entry.data)
            record = entry.record.with_suffix(".json.tmp")
            record.write_text(json.dumps({"url": fill.url, "size": size, "etag": etag}))
            os.rename(record, entry.record)
            return True
        finally:
            os.close(fd)

    def _make_room(self, size: int, keep: str) -> bool:
        """Remove the least recently used copies not in use until ``size`` more bytes fit
        under the limit (and the temporary files of downloads that died)."""
        copies: list[tuple[float, int, str]] = []
        for item in os.scandir(self.directory):
            stem, _, suffix = item.name.partition(".")
            if suffix == "shard" and stem != keep:
                st = item.stat()
                copies.append((st.st_mtime, st.st_size, stem))
            elif suffix.endswith("tmp"):  # a download's or a record's, if its writer died
                self._remove_if_free(stem, temp=Path(item.path))
        if self.limit is None:
            return True
        total = sum(s for _, s, _ in copies)
        for _, bytes_, stem in sorted(copies):
            if total + size <= self.limit:
                break
            if self._remove_if_free(stem):
                total -= bytes_
        return total + size <= self.limit

    def _remove_if_free(self, stem: str, temp: Path | None = None) -> bool:
        lock = self.directory / f"{stem}.lock"
        fd = _lock_file(lock, _mode("LOCK_EX", "LOCK_NB"))
        if fd is None:
            return False  # being read or downloaded
        try:
            if temp is not None:
                temp.unlink(missing_ok=True)
                return True
            (self.directory / f"{stem}.json").unlink(missing_ok=True)
            (self.directory / f"{stem}.shard").unlink(missing_ok=True)
            lock.unlink(missing_ok=True)  # a waiter on it finds the path gone and retries
            return True
        finally:
            os.close(fd)

    # -- what a run holds -----------------------------------------------------------------
    def _hold(self, item: Any) -> Any:
        with self._lock:
            closed = self._closed
            if not closed:
                self._held.add(item)
        if closed:  # the run stopped while this waited for its lock: give it back
            item.abort() if isinstance(item, CacheFill) else item.release()
            raise OSError(f"the shard cache of {self.directory} was closed")
        return item

    def _swap(self, old: CacheFill, new: CacheLease) -> None:
        with self._lock:
            self._held.discard(old)
        self._hold(new)

    def _forget(self, item: CacheLease | CacheFill) -> None:
        with self._lock:
            self._held.discard(item)

    def close(self) -> None:
        """Release every lease and abandon every download this run still holds."""
        with self._lock:
            self._closed = True
            held = list(self._held)
        for item in held:
            if isinstance(item, CacheFill):
                item.abort()
            else:
                item.release()
