"""botocore's data files for S3, loaded once where the dataset is made, for every S3 client
made after.

An S3 client reads botocore's description of the service (JSON files of some MiB: the API,
the endpoint rules, the partitions) as it is made, 0.1-0.2 s of CPU on 2 cores. Each
consumer makes its own client every epoch (a client belongs to one event loop), so that was
paid per DataLoader worker per epoch, before its first read: on a second epoch read from the
local cache it was most of the epoch's fixed cost. botocore keeps what it read in the
loader of a session; this module makes one session's client once, in the loader's process
(the forked workers inherit it), and hands its loader to the sessions the stores make.
The loader only caches parsed files; sharing it between sessions is what botocore's own
sessions do with their components.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["s3_session", "warm_s3"]

_LOADER: list[Any] = []  # the warmed loader, once made (a list: no ``global`` statement)
_LOCK = threading.Lock()


def warm_s3() -> None:
    """Make a throwaway S3 client (no request is sent) so botocore's files are loaded and
    kept; best effort: any failure leaves clients to load them as they always did."""
    with _LOCK:
        if _LOADER:
            return
        try:
            from aiobotocore.session import AioSession  # type: ignore[import-untyped]
        except ImportError:
            return
        session = AioSession()

        async def make() -> None:
            async with session.create_client(
                "s3", region_name="us-east-1", aws_access_key_id="-", aws_secret_access_key="-"
            ):
                pass

        def run() -> None:  # its own loop, in its own thread: the caller's may be running
            try:
                asyncio.run(make())
            except Exception:  # best effort (see above)
                return
            _LOADER.append(session.get_component("data_loader"))

        thread = threading.Thread(target=run, name="torch_spdl.streaming.warm_s3")
        thread.start()
        thread.join()


def s3_session(options: dict[str, Any]) -> Any:
    """A new session sharing the warmed loader, for s3fs's ``session`` option; None when
    there is no warmed loader or the options name a session or profile of their own."""
    if not _LOADER or "session" in options or "profile" in options:
        return None
    from aiobotocore.session import AioSession

    session = AioSession()
    session.register_component("data_loader", _LOADER[0])
    return session
