"""Ranged reads of objects named by URLs, on the pipeline's event loop, through fsspec.

One :class:`Store` serves one run of a pipeline: the fsspec filesystems it opens are
asynchronous ones bound to that run's event loop (s3fs and fsspec's HTTP filesystem are
asyncio code, so hundreds of reads can wait at once on one thread), and it closes their
sessions before the loop ends. A filesystem with no async implementation (local files)
is called on the loop's default executor, which the pipeline owns.

Every request is a ranged read ``[start, end)``, its body taken in as it arrives
(:mod:`._body`): a read that starts past the end of the object returns no bytes (S3 and
HTTP answer 416), a server that ignores ``Range`` and sends the whole object is cut to the
range asked for, and a response that breaks off is retried from the byte it stopped at.
Retries are :mod:`._retry`'s alone: the stores opened here have botocore's and s3fs's own
retry loops turned off.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import Mapping
from typing import Any

from ._body import body_parts
from ._retry import RetryPolicy
from ._s3_warm import s3_session, warm_s3

__all__ = ["Store", "import_filesystems", "protocol_of"]


def protocol_of(url: str) -> str:
    """``s3``, ``http``, ``https``, ``file``... (no scheme: a local path)."""
    return url.split("://", 1)[0] if "://" in url else "file"


def import_filesystems(urls: list[str]) -> None:
    """Import the fsspec filesystems ``urls`` need (s3fs with botocore, aiohttp), here and
    now: a DataLoader's forked workers then inherit them instead of each importing them
    before its first read (0.5-1.5 s a worker on 2 cores, on the first batch's path). A
    missing one fails here, naming the package, rather than in a worker."""
    import fsspec  # type: ignore[import-untyped]

    protocols = {protocol_of(url) for url in urls} - {"file"}
    for protocol in sorted(protocols):
        fsspec.get_filesystem_class(protocol)
    if protocols & {"s3", "s3a"}:
        warm_s3()


def _s3_defaults(options: dict[str, Any]) -> dict[str, Any]:
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    session = s3_session(options)  # botocore's files already loaded (_s3_warm.py)
    extra = {} if session is None else {"session": session}
    return {**options, "config_kwargs": config, **extra}


class Store:
    """Reads for one pipeline run. Create it anywhere; use it on the run's event loop.

    Args:
        storage_options: fsspec options per protocol (``{"s3": {"endpoint_url": ...}}``),
            or one dict used for every protocol.
        retry: how failed reads are retried.
        seed: seeds the jitter of the retry pauses (never the global RNG).
    """

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None,
        retry: RetryPolicy,
        seed: int = 0,
    ) -> None:
        self._options = dict(storage_options or {})
        self._retry = retry
        self._jitter = random.Random(seed)
        self._fs: dict[str, Any] = {}
        # A pipeline built from ``StreamingDataset.builder()`` has no hook to close the
        # sessions on its loop; they are then closed when the store is collected.
        weakref.finalize(self, _abandon, self._fs)

    def _options_for(self, protocol: str) -> dict[str, Any]:
        opts = self._options
        if protocol in opts and isinstance(opts[protocol], Mapping):
            return dict(opts[protocol])
        if any(isinstance(v, Mapping) for v in opts.values()):
            return {}  # per-protocol options, none for this protocol
        return dict(opts)

    async def _filesystem(self, protocol: str) -> Any:
        fs = self._fs.get(protocol)
        if fs is not None:
            return fs
        import fsspec

        cls = fsspec.get_filesystem_class(protocol)
        options = self._options_for(protocol)
        if protocol in ("s3", "s3a"):
            options = _s3_defaults(options)
        if getattr(cls, "async_impl", False):
            options.update(asynchronous=True, loop=asyncio.get_running_loop())
        fs = cls(skip_instance_cache=True, **options)
        if protocol in ("s3", "s3a"):
            fs.retries = 1  # s3fs's own retry loop: ours decides
        self._fs[protocol] = fs
        return fs

    async def read(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (fewer at the end of the object), retried: a
        retry asks only for what the attempts before it did not bring."""
        protocol = protocol_of(url)
        fs = await self._filesystem(protocol)
        parts: list[bytes] = []
        got = 0

        async def once() -> None:
            nonlocal got
            async for part in body_parts(fs, protocol, url, start + got, end):
                parts.append(part)
                got += len(part)

        await self._retry.run(once, url, f"bytes {start}-{end - 1}", self._jitter)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def size(self, url: str) -> int:
        """The size of ``url`` in bytes, retried."""
        return (await self.info(url))[0]

    async def info(self, url: str) -> tuple[int, str | None]:
        """The size of ``url`` in bytes and its version tag (the ETag; for a server that
        gives none, Last-Modified; for a file, its modification time), retried."""
        protocol = protocol_of(url)
        fs = await self._filesystem(protocol)

        async def once() -> tuple[int, str | None]:
            if protocol in ("http", "https"):
                # fsspec's HTTP ``info`` reads any failure as "not found"; a 503 must stay
                # a 503 to be retried, so the HEAD request is made here.
                session = await fs.set_session()
                async with session.head(fs.encode_url(url), allow_redirects=True) as resp:
                    if resp.status == 404:
                        raise FileNotFoundError(url)
                    resp.raise_for_status()
                    headers = resp.headers
                    length = headers.get("Content-Length")
                    tag = headers.get("ETag") or headers.get("Last-Modified")
                if length is None:
                    raise OSError(f"{url}: the server does not give its size")
                return int(length), tag
            if getattr(fs, "async_impl", False):
                info = await fs._info(url)
            else:
                info = await asyncio.to_thread(fs.info, url)
            tag = info.get("ETag") or info.get("etag") or info.get("mtime")
            return int(info["size"]), None if tag is None else str(tag)

        return await self._retry.run(once, url, "size", self._jitter)

    async def close(self) -> None:
        """Close the sessions the filesystems opened (on the loop they were opened on)."""
        fss = dict(self._fs)
        self._fs.clear()
        for fs in fss.values():
            session = getattr(fs, "_s3", None)
            try:
                if session is not None:
                    await session.__aexit__(None, None, None)
                elif getattr(fs, "_session", None) is not None:
                    await fs._session.close()
            except Exception:  # a session already gone is closed enough
                pass


def _abandon(fss: dict[str, Any]) -> None:
    """Close the sockets of sessions whose loop is gone (what fsspec does for its own)."""
    for fs in fss.values():
        s3 = getattr(fs, "_s3", None)
        session = getattr(fs, "_session", None)
        try:
            if s3 is not None:
                s3._endpoint.http_session._connector._close()
            elif session is not None and session.connector is not None:
                session.connector._close()
        except Exception:  # already gone
            pass
    fss.clear()
