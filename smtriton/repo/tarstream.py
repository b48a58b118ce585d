"""A model archive's members, read from its gzip stream by our own code so that each step is bounded.

tarfile is not used to read: it reads a GNU long name or a pax header whole, whatever size its header
gives, follows a chain of them by recursion, and keeps every member it has read. Here each header is one
block parsed by ``tarfile.TarInfo.frombuf``; an extension (a long name, a long link target, a pax
header) is refused before it is read when it is larger than ``MAX_EXTENSION`` or when more than
``MAX_EXTENSIONS`` come in a row; nothing is kept from one member to the next; and every byte inflated,
headers, padding and what follows the tar's end included, is counted against a cap before it is read.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

AGAIN = "copy or upload it again"
GZIP_MAGIC = b"\x1f\x8b"
BLOCK = tarfile.BLOCKSIZE
# A path this system can open is at most PATH_MAX (4 KiB) long: an extension holding a path, a link
# target and a few numbers needs far less, and a pax header's other records (times, owners, extended
# attributes) are read only to be skipped.
MAX_EXTENSION = 1 << 20
# GNU tar writes at most a long name and a long link before a member, a pax writer one header (after a
# global one, once).
MAX_EXTENSIONS = 16
CHUNK = 1 << 20
_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.XGLTYPE)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
# Members whose header's size is not followed by data (tarfile's reading, which writers follow).
_NO_DATA = (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)


class Unreadable(ValueError):
    """Why the archive cannot be read, in words that follow its name."""


class Overflow(ValueError):
    """The archive inflates to more than the cap: nothing past it is read."""


@dataclass(frozen=True)
class Member:
    """One member as its headers (and the extensions before them) give it. Bytes of a name or link that
    are not UTF-8 stand as surrogates (``surrogateescape``); ``kind`` is REGTYPE for every regular
    file, GNUTYPE_SPARSE for a sparse one, else the header's type."""

    name: str
    kind: bytes
    size: int
    link: str
    mode: int


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> dict[bytes, bytes]:
    """A pax header's records, ``<length> <key>=<value>\\n`` each (trailing NULs ignored)."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        end = pos + length
        key, equals, value = data[space + 1 : end - 1].partition(b"=")
        if length <= len(digits) + 1 or end > len(data) or data[end - 1 : end] != b"\n" or not equals or not key:
            raise Unreadable(f"is corrupt: a pax header's record at byte {pos} is malformed ({AGAIN})")
        records[key] = value
        pos = end
    return records


class TarStream:
    """The tar inside an open gzip stream (not ``compressed``: an open tar file), read forward once.
    ``members()`` yields each member; while a member is the current one, ``data()`` reads its bytes;
    ``finish()`` reads what follows the tar's end, so that the gzip trailer (its CRC) is checked. No read
    passes ``cap`` inflated bytes."""

    def __init__(self, stream: io.BufferedIOBase, cap: int, *, compressed: bool = True) -> None:
        self._stream = stream
        self.cap = cap
        self._compressed = compressed
        self.offset = 0  # bytes inflated so far
        self._data = 0  # the current member's data not read yet
        self._padding = 0  # and the padding to the next block after it

    def _inflate(self, size: int) -> bytes:
        try:
            return self._stream.read(size)
        except EOFError:
            raise Unreadable(f"is truncated: its gzip data ends early ({AGAIN})") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise Unreadable(f"is corrupt: {exc} ({AGAIN})") from None

    def _read(self, size: int) -> bytes:
        if self.offset + size > self.cap:
            raise Overflow
        data = self._inflate(size)
        self.offset += len(data)
        return data

    def _exactly(self, size: int, inside: str) -> bytes:
        data = self._read(size)
        if len(data) < size:
            raise Unreadable(f"is truncated: its tar data ends inside {inside} ({AGAIN})")
        return data

    def _skip(self, size: int, inside: str) -> None:
        if self.offset + size > self.cap:
            raise Overflow
        while size > 0:
            size -= len(self._exactly(min(size, CHUNK), inside))

    def data(self) -> Iterator[bytes]:
        """The current member's data, in chunks of at most ``CHUNK`` bytes."""
        if self.offset + self._data > self.cap:
            raise Overflow
        while self._data > 0:
            chunk = self._exactly(min(self._data, CHUNK), "a file")
            self._data -= len(chunk)
            yield chunk

    def _header(self) -> tarfile.TarInfo | None:
        """The next header block parsed, None at the tar's end (a zero block, or the data's end)."""
        self._skip(self._data + self._padding, "a file")
        self._data = self._padding = 0
        at = self.offset
        block = self._read(BLOCK)
        if at and len(block) < BLOCK:
            if block:
                raise Unreadable(f"is truncated: its tar data ends inside a header ({AGAIN})")
            return None
        if len(block) == BLOCK and block.count(0) == BLOCK:
            return None
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            if not at and not self._compressed:
                raise Unreadable(f"is neither gzip-compressed nor a tar archive ({exc})") from None
            if not at:
                raise Unreadable(f"is not a tar archive: its gzip data holds no tar entries ({exc})") from None
            raise Unreadable(f"is corrupt: the tar header at byte {at} is damaged ({exc}; {AGAIN})") from None
        if info.size < 0:
            raise Unreadable(f"is corrupt: the tar header at byte {at} gives a negative size ({AGAIN})")
        return info

    def _extension(self, info: tarfile.TarInfo, fields: dict[str, str], shared: dict[str, str]) -> None:
        """Read one extension header into ``fields`` (the next member's) or ``shared`` (every later one's)."""
        if info.size > MAX_EXTENSION:
            raise Unreadable(
                f"has a tar header extension (long name or pax header) of {info.size} bytes: "
                f"more than the {MAX_EXTENSION} a header may hold"
            )
        data = self._exactly(info.size, "a header")
        self._skip(-info.size % BLOCK, "a header")
        if info.type in _LONG:
            fields["path" if info.type == tarfile.GNUTYPE_LONGNAME else "linkpath"] = _text(data.split(b"\0", 1)[0])
            return
        into = shared if info.type == tarfile.XGLTYPE else fields
        for record, value in _pax_records(data).items():
            if record in (b"path", b"linkpath"):
                into[record.decode()] = _text(value)
            elif record == b"size":
                if not value.isdigit() or len(value) > 20:  # a size is a 64-bit number
                    raise Unreadable(f"is corrupt: a pax header's size is not a number ({AGAIN})")
                into["size"] = value.decode()
            elif record.startswith(b"GNU.sparse."):
                into["sparse"] = "1"

    def members(self) -> Iterator[Member]:
        """Each member in order, its extensions applied; the data of one not read is skipped."""
        fields: dict[str, str] = {}
        shared: dict[str, str] = {}
        row = 0
        while (info := self._header()) is not None:
            if info.type in _LONG or info.type in _PAX:
                row += 1
                if row > MAX_EXTENSIONS:
                    raise Unreadable(f"has more than {MAX_EXTENSIONS} tar header extensions in a row")
                self._extension(info, fields, shared)
                continue
            given = shared | fields
            name, link = given.get("path", info.name), given.get("linkpath", info.linkname)
            size = int(given.get("size", info.size))
            kind = info.type
            if kind in _REGULAR:
                kind = tarfile.DIRTYPE if kind == tarfile.AREGTYPE and name.endswith("/") else tarfile.REGTYPE
            if "sparse" in given or info.type == tarfile.GNUTYPE_SPARSE:
                kind = tarfile.GNUTYPE_SPARSE
            self._data = 0 if kind in _NO_DATA else size
            self._padding = -self._data % BLOCK
            fields, row = {}, 0
            yield Member(name, kind, size if kind not in _NO_DATA else 0, link, info.mode)

    def finish(self) -> None:
        """Read what follows the tar's end to the gzip stream's end (counted like the rest), so that a
        damaged trailer is found."""
        self._skip(self._data + self._padding, "a file")
        self._data = self._padding = 0
        # One byte past the cap says whether more follows.
        while data := self._inflate(min(CHUNK, self.cap - self.offset + 1)):
            self.offset += len(data)
            if self.offset > self.cap:
                raise Overflow


@contextlib.contextmanager
def open_tar(archive: Path, cap: int, *, plain: bool = False) -> Iterator[TarStream]:
    """The tar inside the gzip file ``archive``, inflated on demand up to ``cap`` bytes; with ``plain``,
    a tar that is not compressed is read too (counted the same)."""
    with archive.open("rb") as raw:
        head = raw.read(2)
        if not head:
            raise Unreadable("is empty")
        raw.seek(0)
        if head != GZIP_MAGIC:
            if not plain:
                raise Unreadable("is not gzip-compressed: a model archive is a .tar.gz (as smtriton package writes)")
            yield TarStream(raw, cap, compressed=False)
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield TarStream(stream, cap)
