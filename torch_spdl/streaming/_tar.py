"""WebDataset's tar convention, parsed incrementally from byte chunks at known offsets.

A WebDataset shard is a plain tar file: the files that share a *key* (the path up to the
first dot of the file name) form one sample, and the rest of the name after that dot is
the field (``000123.jpg``, ``000123.cls`` -> sample ``000123`` with fields ``jpg`` and
``cls``; extensions are lower-cased, as WebDataset does). A sample's files are adjacent.

The parser is our own rather than ``tarfile``'s because it must know where each sample
starts and ends in the object: a sample's byte span is what a resume reads back with one
ranged request, and a read can start at any sample's first header. It is fed chunks of
the object in order (each chunk is one ranged read) and keeps only the bytes of the file
being assembled. It reads ustar and GNU tar (long names) and pax headers (``path``), which
is what ``tar``, Python's ``tarfile`` and WebDataset's ``TarWriter`` write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["RawSample", "TarFormatError", "TarSplitter"]

_BLOCK = 512
_NAME = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


class TarFormatError(ValueError):
    """The bytes of a shard are not a well-formed tar where the parser stands.
    ``completed``: the samples the same call had completed before the fault."""

    completed: list[RawSample] = []


@dataclass
class RawSample:
    """One sample as stored: its key, its fields' bytes by extension, and where it lies in
    the object (``start`` is its first header, ``end`` the byte after its last file)."""

    key: str
    start: int
    end: int
    fields: dict[str, bytes] = field(default_factory=dict)


def _octal(raw: bytes, what: str, offset: int) -> int:
    if raw and raw[0] & 0x80:  # GNU base-256 for large values
        value = int.from_bytes(raw[1:], "big")
        return value
    text = raw.rstrip(b"\0 ").strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise TarFormatError(
            f"bad {what} field {raw!r} in the tar header at byte {offset}"
        ) from None


def _checksum_ok(header: bytes) -> bool:
    stored = header[148:156]
    try:
        expected = int(stored.rstrip(b"\0 ").strip() or b"0", 8)
    except ValueError:
        return False
    total = sum(header[:148]) + 8 * 32 + sum(header[156:])
    return total == expected


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if any."""
    i = 0
    path = None
    while i < len(data):
        space = data.find(b" ", i)
        if space < 0:
            break
        length = int(data[i:space])
        record = data[space + 1 : i + length - 1]  # without the newline
        key, _, value = record.partition(b"=")
        if key == b"path":
            path = value.decode("utf-8")
        i += length
    return path


class TarSplitter:
    """Samples out of a tar stream fed in order, chunk by chunk.

    Args:
        start: the offset in the object of the first byte fed (a header boundary).
    """

    def __init__(self, start: int = 0) -> None:
        self._buf = b""
        self._pos = 0  # where the next header starts in _buf
        self._base = start  # the object offset of _buf[_pos]
        self._member_start: int | None = None  # first header of the file being read
        self._long_name: str | None = None
        self._current: RawSample | None = None
        self._ended = False

    @property
    def ended(self) -> bool:
        """Whether the end-of-archive blocks were reached."""
        return self._ended

    def feed(self, data: bytes) -> list[RawSample]:
        """Take the next bytes; return the samples completed by them."""
        if self._ended:
            return []
        # one copy per chunk: what was left of the last one, then this one
        self._buf = self._buf[self._pos :] + data if self._pos < len(self._buf) else data
        self._pos = 0
        buf = self._buf
        done: list[RawSample] = []
        try:
            self._parse(buf, done)
        except TarFormatError as exc:
            exc.completed = done
            raise
        return done

    def _parse(self, buf: bytes, done: list[RawSample]) -> None:
        while not self._ended:
            pos = self._pos
            if len(buf) - pos < _BLOCK:
                break
            header = buf[pos : pos + _BLOCK]
            offset = self._base
            if header == b"\0" * _BLOCK:
                self._ended = True
                break
            if not _checksum_ok(header):
                raise TarFormatError(f"bad tar header checksum at byte {offset}")
            size = _octal(header[124:136], "size", offset)
            padded = (size + _BLOCK - 1) // _BLOCK * _BLOCK
            if len(buf) - pos < _BLOCK + padded:
                break  # the rest of this member comes with a later chunk
            payload = buf[pos + _BLOCK : pos + _BLOCK + size]
            self._pos = pos + _BLOCK + padded
            self._base += _BLOCK + padded
            if self._member_start is None:
                self._member_start = offset
            kind = header[156:157]
            if kind == b"L":  # GNU long name: the name of the next member
                self._long_name = payload.rstrip(b"\0").decode("utf-8")
                continue
            if kind == b"x":
                self._long_name = _pax_path(payload) or self._long_name
                continue
            if kind == b"g":  # global pax header: nothing we use
                self._member_start = None
                continue
            start, self._member_start = self._member_start, None
            name = self._long_name if self._long_name is not None else self._name(header)
            self._long_name = None
            if kind not in (b"0", b"\0", b"7"):  # directories, links: not sample files
                continue
            match = _NAME.match(name)
            if match is None:
                continue  # a file without an extension is no field
            key, ext = match.group(1), match.group(2).lower()
            if key.startswith("./"):
                key = key[2:]
            sample = self._current
            if sample is not None and sample.key != key:
                done.append(sample)
                sample = None
            if sample is None:
                sample = self._current = RawSample(key, start, self._base)
            if ext in sample.fields:
                raise TarFormatError(f"sample {key!r} has two {ext!r} files (at byte {offset})")
            sample.fields[ext] = payload
            sample.end = self._base

    def finish(self) -> list[RawSample]:
        """The stream has ended: the last sample; raises when it ended inside a member."""
        left = self._buf[self._pos :]
        if left.strip(b"\0") and not self._ended:
            raise TarFormatError(
                f"the tar ends inside a member: {len(left)} bytes left at byte {self._base}"
            )
        last, self._current = self._current, None
        return [] if last is None else [last]

    @staticmethod
    def _name(header: bytes) -> str:
        name = header[:100].split(b"\0", 1)[0].decode("utf-8")
        if header[257:262] == b"ustar":
            prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8")
            if prefix:
                name = f"{prefix}/{name}"
        return name
