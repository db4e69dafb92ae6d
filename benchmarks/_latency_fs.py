"""A read-only loopback FUSE filesystem that adds a fixed delay to every open and every
read: files on network storage, emulated where the scripts see them, as paths.

Why a filesystem and not a slow client: the training scripts that ``real_scripts.py`` runs
open paths (``ImageFolder``, ``Image.open(path)``), as their public originals do, so the
latency has to be paid below the ``open`` and ``read`` system calls, where an NFS or a
FUSE mount of an object store pays it; a ``time.sleep`` in the script would be user code
that the loaders run differently, and an fsspec store would need the scripts rewritten.

How: this module is also the server's program (``python _latency_fs.py SOURCE MOUNT
--delay-ms 5 --counters FILE``). It mirrors ``SOURCE`` at ``MOUNT`` through fusepy
(``getattr``, ``readdir``, ``open``, ``read``, ``release``; nothing that writes), and
``open`` and ``read`` sleep ``--delay-ms`` before they answer. libfuse runs each request
on a thread of its own (the multithreaded loop) and the sleep releases the GIL, so
requests in flight overlap as they do against a network server: the delay is latency,
not a throughput cap. The kernel's page cache for a file is dropped at each ``open``
(no ``kernel_cache``/``auto_cache``), so every epoch reads the files through the server
again, as a dataset larger than memory would; within one open, the kernel reads ahead in
requests of up to 128 KiB, so one small JPEG is one ``open`` and one ``read``: about
10 ms a file. Attributes and lookups are cached by the kernel for a second (libfuse's
defaults) and cost no delay, as an NFS client caches them.

The server counts its opens and reads in ``--counters``, a 16-byte file it maps (two
little-endian uint64), which :class:`LatencyMount` reads between runs: what a run cost in
round trips, on each side alike.

:class:`LatencyMount` starts the server as a subprocess, waits for the mount, and on exit
(also on failure or Ctrl-C) unmounts it (``fusermount -u`` where installed, else
``umount``, then ``umount -l`` if it is still busy) and stops the server. Needs
``/dev/fuse``, libfuse 2 (Debian: ``apt-get install -y libfuse2``) and fusepy (``pip
install -e '.[bench]'``); when the mount fails, the error says so, with the server's own
message.
"""

from __future__ import annotations

import argparse
import errno
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

INSTALL = (
    "the latency store needs /dev/fuse, libfuse 2 (Debian: apt-get install -y libfuse2) and "
    "fusepy (pip install -e '.[bench]')"
)


def serve(source: str, mount: str, delay_s: float, counters: str) -> None:
    """Mirror ``source`` at ``mount`` read-only, each open and read ``delay_s`` late; runs
    until the filesystem is unmounted."""
    import fuse  # fusepy: imported here, so the benchmark can say how to install it

    class Passthrough(fuse.Operations):  # type: ignore[misc]
        def __init__(self) -> None:
            fd = os.open(counters, os.O_RDWR)
            self.counts = mmap.mmap(fd, 16)
            os.close(fd)
            self.lock = threading.Lock()

        def _count(self, slot: int) -> None:
            with self.lock:
                (n,) = struct.unpack_from("<Q", self.counts, slot * 8)
                struct.pack_into("<Q", self.counts, slot * 8, n + 1)

        def _real(self, path: str) -> str:
            return os.path.join(source, path.lstrip("/"))

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            try:
                st = os.lstat(self._real(path))
            except OSError as e:
                raise fuse.FuseOSError(e.errno or errno.EIO) from e
            keys = ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_mtime")
            return {k: getattr(st, k) for k in (*keys, "st_atime", "st_ctime")}

        def readdir(self, path: str, fh: Any) -> list[str]:
            return [".", "..", *os.listdir(self._real(path))]

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
                raise fuse.FuseOSError(errno.EROFS)
            time.sleep(delay_s)
            self._count(0)
            return os.open(self._real(path), os.O_RDONLY)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            time.sleep(delay_s)
            self._count(1)
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

    fuse.FUSE(Passthrough(), mount, foreground=True, nothreads=False, ro=True)


class LatencyMount:
    """``with LatencyMount(source, delay_s) as m:`` ``m.path`` serves ``source`` with the
    delay; :meth:`counts` is (opens, reads) so far, :meth:`server_cpu_s` the server's CPU
    seconds so far (another process's, which a run's disturbance check must not count)."""

    def __init__(self, source: str | Path, delay_s: float = 0.005) -> None:
        self.source, self.delay_s = str(source), delay_s
        self._dir = tempfile.mkdtemp(prefix="latency_fs_")
        self.path = os.path.join(self._dir, "mnt")
        self._counters = os.path.join(self._dir, "counters")
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LatencyMount:
        os.mkdir(self.path)
        Path(self._counters).write_bytes(bytes(16))
        cmd = [sys.executable, os.path.abspath(__file__), self.source, self.path]
        cmd += ["--delay-ms", str(self.delay_s * 1000), "--counters", self._counters]
        log = open(os.path.join(self._dir, "server.log"), "wb")  # noqa: SIM115
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                text = Path(self._dir, "server.log").read_text(errors="replace")[-2000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"the latency store did not mount: {text.strip()}\n{INSTALL}")
            time.sleep(0.05)
        return self

    def counts(self) -> tuple[int, int]:
        opens, reads = struct.unpack("<QQ", Path(self._counters).read_bytes())
        return opens, reads

    def server_cpu_s(self) -> float:
        import psutil

        if self._proc is None:
            return 0.0
        t = psutil.Process(self._proc.pid).cpu_times()
        return t.user + t.system

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tools = [["fusermount", "-u"]] if shutil.which("fusermount") else []
        for tool in [*tools, ["umount"], ["umount", "-l"]]:  # the last detaches a busy one
            if not os.path.ismount(self.path):
                break
            subprocess.run([*tool, self.path], capture_output=True)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if not os.path.ismount(self.path):  # never walk into a mount that is still there
            shutil.rmtree(self._dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="the latency store's server (see docstring)")
    parser.add_argument("source")
    parser.add_argument("mount")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--counters", required=True)
    args = parser.parse_args()
    serve(args.source, args.mount, args.delay_ms / 1000, args.counters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
