"""Local object stores for tests, examples and benchmarks: S3 (moto) and HTTP on 127.0.0.1,
with latency and faults injected by the server, and a writer of WebDataset shards.

Streaming code has to be tested against the servers it talks to, failing the way they
fail (a 503, a reset connection, a body cut short, a response that never comes), and
CI has no network. Both servers run in a thread of the calling process, on a free port of
the loopback address, and record every request (method, path, ``Range``) so that a test
can check what was read. :class:`LocalS3` needs ``moto[server]``; :class:`LocalHTTP` only
the standard library.

A fault plan maps an object's path to the faults its next requests meet, one per request:
``"503"``, ``"reset"`` (the connection is closed with a TCP reset before any answer),
``"truncate"`` (the headers promise the whole body; half comes, then the connection
closes: every byte of that half reaches the client, so a test can say where a retry
must start), ``"hang"`` (no answer until the server stops). ``latency`` delays every
request by that many seconds (a sleep in the server, as a remote store's round trip).
Besides the request log, the servers count the body bytes they send per path
(:meth:`Faults.bytes_sent`): what a test of "reads only what it needs" counts.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

__all__ = ["Faults", "LocalHTTP", "LocalS3", "write_shard"]


def write_shard(samples: Iterable[Mapping[str, Any]]) -> bytes:
    """A WebDataset tar: each sample a mapping with ``"__key__"`` and ``{ext: bytes | str}``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in samples:
            key = sample["__key__"]
            for ext, value in sample.items():
                if ext.startswith("__"):
                    continue
                data = value.encode() if isinstance(value, str) else bytes(value)
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o444
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@dataclass
class Faults:
    """What the server does: latency, faults per path, and the log of requests."""

    latency: float = 0.0
    plan: dict[str, list[str]] = field(default_factory=dict)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    released: threading.Event = field(default_factory=threading.Event)
    in_flight: int = 0  # requests the HTTP server is answering now
    max_in_flight: int = 0  # the most it answered at once so far
    _lock: threading.Condition = field(default_factory=threading.Condition)

    def next_fault(self, method: str, path: str, range_header: str | None) -> str | None:
        with self._lock:
            self.log.append((method, path, range_header))
            faults = self.plan.get(path)
            if method == "GET" and faults:
                return faults.pop(0)
        return None

    def gets(self, suffix: str = "") -> list[tuple[str, str | None]]:
        """The GET requests made so far: ``(path, Range)``."""
        with self._lock:
            return [(p, r) for m, p, r in self.log if m == "GET" and p.endswith(suffix)]

    def answering(self) -> None:
        """A request is being answered (counted by the HTTP server)."""
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def answered(self) -> None:
        """A request's answer is over (sent, or the connection ended)."""
        with self._lock:
            self.in_flight -= 1

    def count_sent(self, path: str, size: int) -> None:
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + size
            self._lock.notify_all()

    def wait_sent(self, suffix: str, size: int, timeout: float) -> bool:
        """Wait until ``size`` body bytes were sent for the paths that end with ``suffix``
        (False: ``timeout`` seconds passed first)."""
        with self._lock:
            return self._lock.wait_for(
                lambda: sum(n for p, n in self.sent.items() if p.endswith(suffix)) >= size,
                timeout,
            )

    def bytes_sent(self, suffix: str = "") -> int:
        """The body bytes sent so far for the paths that end with ``suffix``."""
        with self._lock:
            return sum(n for p, n in self.sent.items() if p.endswith(suffix))

    def clear(self) -> None:
        """Forget the requests and bytes so far (the plan stays)."""
        with self._lock:
            self.log.clear()
            self.sent.clear()


class _Connections:
    """The open connections of a threading server, so that stopping it can end them:
    a client that keeps its connection alive would otherwise keep its handler thread."""

    def __init__(self, server: Any) -> None:
        self.open: set[socket.socket] = set()
        self._lock = threading.Lock()
        accept, finish = server.get_request, server.shutdown_request

        def get_request() -> Any:
            sock, addr = accept()
            with self._lock:
                self.open.add(sock)
            return sock, addr

        def shutdown_request(sock: Any) -> None:
            with self._lock:
                self.open.discard(sock)
            finish(sock)

        server.get_request, server.shutdown_request = get_request, shutdown_request
        server.daemon_threads, server.block_on_close = False, True  # server_close joins them

    def end(self) -> None:
        with self._lock:
            socks = list(self.open)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (RST), as a crashed or overloaded server does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _hang_up(sock: socket.socket) -> None:
    """End the connection after what was written (a FIN: nothing sent is lost), as a
    proxy that gives up on a long response does."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[6:].partition("-")
    start = int(first)
    end = size if not last else min(size, int(last) + 1)
    return start, end


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def _answer(self, head_only: bool) -> None:
        faults = self.server.faults
        fault = faults.next_fault(self.command, self.path, self.headers.get("Range"))
        if faults.latency:
            time.sleep(faults.latency)
        if fault == "reset":
            _reset(self.connection)
            self.close_connection = True
            return
        if fault == "hang":
            faults.released.wait()
            self.close_connection = True
            return
        if fault == "503":
            self.send_response(503, "Slow Down")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.server.files.get(self.path.lstrip("/"))
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        span = _parse_range(self.headers.get("Range"), len(body))
        if span is not None and span[0] >= len(body):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = span if span is not None else (0, len(body))
        self.send_response(206 if span is not None else 200)
        if span is not None:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", self.server.etag(self.path.lstrip("/"), body))
        self.end_headers()
        if head_only:
            return
        if fault == "truncate":
            half = body[start : start + (end - start) // 2]
            self.wfile.write(half)
            self.wfile.flush()
            faults.count_sent(self.path, len(half))
            _hang_up(self.connection)
            self.close_connection = True
            return
        self.wfile.write(body[start:end])
        faults.count_sent(self.path, end - start)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.faults.answering()
        try:
            self._answer(head_only=False)
        finally:
            self.server.faults.answered()

    def do_HEAD(self) -> None:  # noqa: N802
        self.server.faults.answering()
        try:
            self._answer(head_only=True)
        finally:
            self.server.faults.answered()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _HTTPServer(http.server.ThreadingHTTPServer):
    request_queue_size = 256

    def __init__(self, files: dict[str, bytes], faults: Faults) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files = files
        self.faults = faults
        self._etags: dict[str, tuple[bytes, str]] = {}

    def etag(self, name: str, body: bytes) -> str:
        """A strong ETag of the body (a digest, remembered while the body is the same)."""
        known = self._etags.get(name)
        if known is None or known[0] is not body:
            known = (body, '"' + hashlib.md5(body, usedforsecurity=False).hexdigest() + '"')
            self._etags[name] = known
        return known[1]


class _Running:
    """A threading server run in a thread of this process: started on entering, and on
    leaving stopped with every connection it still has open and every handler joined."""

    faults: Faults

    def _serve(self, server: Any) -> None:
        self._server = server
        self._connections = _Connections(server)
        host, port = server.server_address[:2]
        self.endpoint = f"http://{host!s}:{port}"
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.faults.released.set()
        self._server.shutdown()
        self._connections.end()
        self._server.server_close()
        self._thread.join()


class LocalHTTP(_Running):
    """An HTTP server of ``files`` (``{name: bytes}``) with ``Range`` support and ETags,
    on 127.0.0.1; a context manager. ``url(name)`` is a file's URL; ``faults`` its plan
    and log; the server serves the dict it was given, so a change to it changes the
    objects."""

    def __init__(self, files: dict[str, bytes], faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        self._serve(_HTTPServer(files, self.faults))

    def url(self, name: str) -> str:
        return f"{self.endpoint}/{name}"


class _Middleware:
    """Latency, faults and the request log in front of moto's WSGI app."""

    def __init__(self, app: Callable[..., Any], faults: Faults) -> None:
        self.app = app
        self.faults = faults

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        faults = self.faults
        path = environ.get("PATH_INFO", "")
        fault = faults.next_fault(environ["REQUEST_METHOD"], path, environ.get("HTTP_RANGE"))
        if faults.latency:
            time.sleep(faults.latency)
        sock = environ.get("werkzeug.socket")
        if fault == "reset" and sock is not None:
            _reset(sock)
            start_response("500 Reset", [("Content-Length", "0")])
            return []
        if fault == "hang":
            faults.released.wait()
            start_response("500 Gone", [("Content-Length", "0")])
            return []
        if fault == "503":
            body = b"<Error><Code>SlowDown</Code><Message>Reduce your rate.</Message></Error>"
            start_response("503 Slow Down", [("Content-Length", str(len(body)))])
            return [body]
        result = self.app(environ, start_response)
        if fault == "truncate":
            data = b"".join(result)
            return _cut(data, sock, faults, path)
        if environ["REQUEST_METHOD"] != "GET":
            return result
        return _counted(result, faults, path)


def _quiet(*args: object, **kwargs: object) -> None:
    pass


def _counted(result: Iterable[bytes], faults: Faults, path: str) -> Iterator[bytes]:
    try:
        for part in result:
            faults.count_sent(path, len(part))
            yield part
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


def _cut(data: bytes, sock: socket.socket | None, faults: Faults, path: str) -> Iterator[bytes]:
    half = data[: len(data) // 2]
    yield half
    faults.count_sent(path, len(half))
    if sock is not None:
        _hang_up(sock)
    raise ConnectionAbortedError("truncated by the fault plan")


class LocalS3(_Running):
    """moto's S3 in server mode on 127.0.0.1, behind the fault middleware; a context
    manager. ``put(bucket, name, data)`` stores an object; ``storage_options`` are what
    fsspec needs to reach it (``{"s3": {...}}``)."""

    def __init__(self, faults: Faults | None = None) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class Handler(MotoRequestHandler):
            log = _quiet  # no line per request

        self.faults = faults or Faults()
        app = _Middleware(DomainDispatcherApplication(create_backend_app), self.faults)
        server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Handler)
        server.log = _quiet  # type: ignore[method-assign]  # no line per request
        self._serve(server)
        self._buckets: set[str] = set()
        self._fs: Any = None

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "s3": {
                "endpoint_url": self.endpoint,
                "key": "testing",
                "secret": "testing",
            }
        }

    def put(self, bucket: str, name: str, data: bytes) -> str:
        """Store ``data`` as ``s3://bucket/name`` (through s3fs; the fault plan applies)."""
        if self._fs is None:
            import s3fs  # type: ignore[import-untyped]

            self._fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options["s3"])
        if bucket not in self._buckets:
            self._fs.mkdir(bucket)
            self._buckets.add(bucket)
        self._fs.pipe_file(f"{bucket}/{name}", data)
        return f"s3://{bucket}/{name}"
