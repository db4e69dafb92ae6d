"""The body of one ranged request, as the pieces arrive, from S3, HTTP or a file system.

A response is consumed piece by piece (not read whole and then returned) so that the bytes
that came before a connection broke are kept: :class:`~._store.Store` retries a cut
response with a ``Range`` that starts where the body stopped, instead of at the range's
first byte. Every reader here yields only bytes of ``[start, end)``: a server that ignores
``Range`` and sends the whole object is cut to the range, and a range that starts at or
past the end of the object yields nothing (S3 and HTTP answer 416 to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ._retry import _status_of

__all__ = ["body_parts"]

_PIECE = 1 << 20  # what one read of a response body asks for


async def body_parts(
    fs: Any, protocol: str, url: str, start: int, end: int
) -> AsyncIterator[bytes]:
    """The bytes ``[start, end)`` of ``url`` in the pieces they arrive in (fewer at the
    end of the object); raises what the client raises when the body breaks off."""
    if start >= end:
        return
    if protocol in ("http", "https"):
        parts = _http(fs, url, start, end)
    elif protocol in ("s3", "s3a"):
        parts = _s3(fs, url, start, end)
    elif getattr(fs, "async_impl", False):
        parts = _cat(fs, url, start, end)
    else:
        parts = _local(fs, url, start, end)
    try:
        async for part in parts:
            yield part
    except Exception as exc:
        status, code = _status_of(exc)
        if status == 416 or code == "InvalidRange":
            return  # the range starts at or past the end
        raise


def _clip(part: bytes, offset: int, start: int, end: int) -> bytes:
    """What of ``part`` (the bytes from ``offset`` on) lies in ``[start, end)``."""
    lo, hi = max(start - offset, 0), min(end - offset, len(part))
    return part[lo:hi] if hi > lo else b""


async def _http(fs: Any, url: str, start: int, end: int) -> AsyncIterator[bytes]:
    kwargs = dict(fs.kwargs)
    headers = dict(kwargs.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{end - 1}"
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kwargs) as resp:
        if resp.status == 404:
            raise FileNotFoundError(url)
        resp.raise_for_status()
        # 206: the range; 200: the server ignored Range and sends the whole object
        offset = start if resp.status == 206 else 0
        async for part in resp.content.iter_chunked(_PIECE):
            piece = _clip(part, offset, start, end)
            offset += len(part)
            if piece:
                yield piece
            if offset >= end:
                break


async def _s3(fs: Any, url: str, start: int, end: int) -> AsyncIterator[bytes]:
    bucket, key, version = fs.split_path(url)
    extra = {"VersionId": version} if version else {}
    resp = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
    )
    body = resp["Body"]
    status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    offset = 0 if status == 200 and "ContentRange" not in resp else start
    try:
        while offset < end:
            part = await body.read(_PIECE)
            if not part:
                break
            piece = _clip(part, offset, start, end)
            offset += len(part)
            if piece:
                yield piece
    finally:
        body.close()


async def _cat(fs: Any, url: str, start: int, end: int) -> AsyncIterator[bytes]:
    """Another asynchronous filesystem: its ranged read, whole."""
    data = await fs._cat_file(url, start=start, end=end)
    yield bytes(data[: end - start])


async def _local(fs: Any, url: str, start: int, end: int) -> AsyncIterator[bytes]:
    """A synchronous filesystem (local files): one read on the loop's default executor."""
    yield await asyncio.to_thread(_read_sync, fs, url, start, end)


def _read_sync(fs: Any, url: str, start: int, end: int) -> bytes:
    with fs.open(url, "rb") as f:
        f.seek(start)
        return bytes(f.read(end - start))
