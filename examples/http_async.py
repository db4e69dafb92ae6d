"""Load files from an HTTP server with an async stage: many requests in flight, one thread.

    .venv/bin/python examples/http_async.py --quick

Starts a real HTTP server (``http.server.ThreadingHTTPServer`` on 127.0.0.1, a free port)
in a thread, serving generated files with a simulated per-request latency (as a remote
object store has). A pipeline fetches them with an ``async`` stage written on raw asyncio
streams (HTTP/1.0 GET, no extra dependency), ``concurrency`` requests at once on the
pipeline's event loop, then checks each body on a worker thread (SHA-256 against the
digest the server was given). The example checks its own result: every file arrived once
with every byte right; it shuts the server down and exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.server
import os
import sys
import threading
import time
from dataclasses import dataclass

from torch_spdl.pipeline import PipelineBuilder


class FileHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files[name]`` at ``/name`` after ``server.latency`` seconds."""

    server: FileServer
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        body = self.server.files.get(self.path.lstrip("/"))
        time.sleep(self.server.latency)  # the remote store's response time
        if body is None:
            self.send_error(404, f"no file {self.path!r}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per request would drown the example's output


class FileServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # many connections arrive at once

    def __init__(self, files: dict[str, bytes], latency: float) -> None:
        super().__init__(("127.0.0.1", 0), FileHandler)
        self.files = files
        self.latency = latency


@dataclass
class Fetched:
    name: str
    body: bytes
    seconds: float


async def fetch(host: str, port: int, name: str) -> Fetched:
    """GET ``/name`` over one connection (HTTP/1.0: the server closes it after the body)."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET /{name} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode()
        if " 200 " not in status + " ":
            raise RuntimeError(f"GET /{name}: {status}")
        length = None
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value)
        body = await (reader.readexactly(length) if length is not None else reader.read())
    finally:
        writer.close()
        with contextlib.suppress(OSError):  # a reset on close must not hide the real error
            await writer.wait_closed()
    return Fetched(name, body, time.perf_counter() - t0)


def make_files(count: int, size: int) -> dict[str, bytes]:
    """``count`` files of ``size`` random bytes (a different size for a few of them)."""
    return {f"shard-{i:05d}.bin": os.urandom(size + (i % 7) * 1000) for i in range(count)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer files")
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--size", type=int, default=64 * 1024, help="bytes per file")
    parser.add_argument("--latency", type=float, default=0.05, help="server delay, seconds")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    args = parser.parse_args()
    count = args.files or (300 if args.quick else 2000)

    files = make_files(count, args.size)
    digests = {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
    server = FileServer(files, args.latency)
    host, port = server.server_address[:2]
    serving = threading.Thread(target=server.serve_forever, name="http-server", daemon=True)
    serving.start()
    print(
        f"serving {count} files of ~{args.size // 1024} KiB on http://{host}:{port} "
        f"with {args.latency * 1000:.0f} ms latency per request"
    )

    async def get(name: str) -> Fetched:
        return await fetch(host, port, name)

    def verify(item: Fetched) -> tuple[str, bool, int, float]:
        ok = hashlib.sha256(item.body).hexdigest() == digests[item.name]
        return item.name, ok, len(item.body), item.seconds

    try:
        pipeline = (
            PipelineBuilder()
            .add_source(sorted(files))
            .pipe(get, concurrency=args.concurrency, name="http_get")
            .pipe(verify, concurrency=2, name="sha256")
            .add_sink(64)
            .build()
        )
        t0 = time.perf_counter()
        seen: dict[str, int] = {}
        bad, total_bytes, latencies = [], 0, []
        with pipeline.auto_stop():
            for name, ok, size, seconds in pipeline:
                seen[name] = seen.get(name, 0) + 1
                total_bytes += size
                latencies.append(seconds)
                if not ok:
                    bad.append(name)
        elapsed = time.perf_counter() - t0
        print(pipeline.format_stats())
    finally:
        server.shutdown()
        server.server_close()
        serving.join()

    serial = count * args.latency
    print(
        f"fetched {len(seen)} files, {total_bytes / 2**20:.1f} MiB in {elapsed:.2f} s: "
        f"{len(seen) / elapsed:.0f} files/s with {args.concurrency} requests in flight "
        f"(one at a time would take at least {serial:.1f} s)"
    )
    latencies.sort()
    print(
        f"request time: median {latencies[len(latencies) // 2] * 1000:.0f} ms, "
        f"max {latencies[-1] * 1000:.0f} ms"
    )
    problems = [f"{n}: bytes differ" for n in bad]
    problems += [f"{n}: fetched {k} times" for n, k in seen.items() if k != 1]
    problems += [f"{n}: never fetched" for n in files if n not in seen]
    for p in problems[:10]:
        print("FAILED:", p)
    if problems:
        return 1
    print("every file arrived once, every byte right: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
