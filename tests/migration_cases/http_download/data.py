"""Test data for the case: PNGs served by a local HTTP server (127.0.0.1, a free port).

The server runs in a thread and is shut down when ``stack`` closes (the test's teardown).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def make_data(root: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    names = []
    for i in range(10):
        name = f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (6, 7), dtype=np.uint8)).save(root / name)
        names.append(name)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="case-http-server", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    stack.callback(stop)
    host, port = server.server_address[:2]
    return {"base_url": f"http://{host}:{port}", "names": names}
