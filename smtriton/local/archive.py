"""Model archives (model.tar.gz) extracted for the local endpoint: whole or not at all, never outside.

An archive is read three times. First its gzip stream, whole: a cut or damaged file is refused before
anything is written (tarfile stops at the tar's end marker and never checks the gzip trailer). Then
its members' headers, with nothing written: every path, link target and type is checked, and the
members are counted and their sizes summed against the limits, before the first byte lands. Last, the
members are written into a fresh folder by our own code, one ``openat`` at a time with
``O_NOFOLLOW``: nothing on the way is followed, so a link the archive made can never redirect a later
member, whatever the link says. Each member must be the one the check saw.

tarfile's own ``data`` filter is not relied on: it resolves links with ``os.path.realpath``, which
stops resolving at ``PATH_MAX``, so a chain of long folder names and links makes a later member land
anywhere the process can write (CVE-2025-4517; every CPython with extraction filters before 3.9.23,
3.10.18, 3.11.13, 3.12.11 and 3.13.4). Here a link is refused when its target is absolute or holds a
``..``, before anything is extracted, and every link is resolved strictly once the archive is out
(a loop, a path too long or a target that is not there: refused).
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from smtriton.errors import ToolUsageError

GZIP_MAGIC = b"\x1f\x8b"
AGAIN = "copy or upload it again"
GIB = 1 << 30
# The defaults of local-endpoint's --max-archive-gib and --max-archive-entries.
DEFAULT_MAX_BYTES = 32 * GIB
DEFAULT_MAX_ENTRIES = 100_000
_CHUNK = 1 << 20


class ArchiveError(ToolUsageError, ValueError):
    """An archive that cannot be extracted safely, or that does not exist."""


@dataclass(frozen=True)
class ExtractLimits:
    """What one archive may hold once extracted: bytes of its files (as their headers say, before any
    is written) and entries (files, folders and links)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_entries: int = DEFAULT_MAX_ENTRIES


@dataclass(frozen=True)
class _Entry:
    """One member as the check saw it: its path's parts, its kind, size and link target."""

    parts: tuple[str, ...]
    kind: bytes
    size: int
    link: str
    executable: bool


def _check_gzip(archive: Path, label: str) -> None:
    """Read the whole gzip stream once: a cut or damaged archive is found before anything is written."""
    with archive.open("rb") as raw:
        head = raw.read(2)
    if not head:
        raise ArchiveError(f"{label} is empty")
    if head != GZIP_MAGIC:
        raise ArchiveError(f"{label} is not gzip-compressed: a model archive is a .tar.gz (as smtriton package writes)")
    try:
        with gzip.open(archive, "rb") as stream:
            while stream.read(_CHUNK):
                pass
    except EOFError:
        raise ArchiveError(f"{label} is truncated: its gzip data ends early ({AGAIN})") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise ArchiveError(f"{label} is corrupt: {exc} ({AGAIN})") from None


def _members(archive: Path, label: str) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The archive's members in order, read as a stream (tar errors said in one line)."""
    try:
        with tarfile.open(archive, "r|gz") as tar:
            for member in tar:
                yield tar, member
    except tarfile.ReadError as exc:
        if "unexpected end of data" in str(exc):
            raise ArchiveError(f"{label} is truncated: its tar data ends inside a file ({AGAIN})") from None
        raise ArchiveError(f"{label} is not a tar archive: its gzip data holds no tar entries ({exc})") from None
    except tarfile.TarError as exc:
        raise ArchiveError(f"{label} cannot be read: {exc}") from None


def _size(count: int) -> str:
    return f"{count / GIB:.4g} GiB" if count >= GIB else f"{count / (1 << 20):.4g} MiB"


def _shown(name: str) -> str:
    """A member's name as a message shows it: a name of thousands of characters is cut."""
    return name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"


def _parts(name: str, label: str) -> tuple[str, ...]:
    """A member's path as its parts below the archive's root (``./`` and ``.`` dropped); refused when it
    is absolute, climbs or holds a NUL."""
    if name.startswith("/") or "\0" in name:
        raise ArchiveError(f"{label} has an unsafe member path: '{_shown(name)}' leaves the archive")
    parts = tuple(p for p in PurePosixPath(name).parts if p != ".")
    if ".." in parts:
        raise ArchiveError(f"{label} has an unsafe member path: '{_shown(name)}' leaves the archive")
    return parts


def _check_link(member: tarfile.TarInfo, label: str) -> None:
    """A symlink may only point down from where it is: a relative target without '..'."""
    target = member.linkname
    parts = PurePosixPath(target).parts
    if not target or "\0" in target or target.startswith("/") or ".." in parts:
        raise ArchiveError(
            f"{label} has an unsafe member: symlink '{_shown(member.name)}' points outside the archive or climbs "
            f"('{_shown(target)}'; a link must be relative and without '..')"
        )


def _entry(member: tarfile.TarInfo, parts: tuple[str, ...]) -> _Entry:
    if member.isdir():
        return _Entry(parts, tarfile.DIRTYPE, 0, "", False)
    if member.issym():
        return _Entry(parts, tarfile.SYMTYPE, 0, member.linkname, False)
    return _Entry(parts, tarfile.REGTYPE, member.size, "", bool(member.mode & stat.S_IXUSR))


def _refuse_unsafe(member: tarfile.TarInfo, entry: _Entry, seen: dict[tuple[str, ...], bytes], label: str) -> None:
    """What the extraction must never be asked to do: follow a link that is absolute or climbs, write
    under a file or a link, or write one name twice. ``seen``: each path before this one, and its kind."""
    parts = entry.parts
    if entry.kind == tarfile.SYMTYPE:
        _check_link(member, label)
    for depth in range(1, len(parts)):
        if seen.setdefault(parts[:depth], tarfile.DIRTYPE) != tarfile.DIRTYPE:
            raise ArchiveError(f"{label} has an unsafe member: '{_shown(member.name)}' lies under a file or symlink")
    if parts in seen and not (entry.kind == tarfile.DIRTYPE == seen[parts]):
        raise ArchiveError(f"{label} has an unsafe member: '{_shown(member.name)}' appears twice")
    seen[parts] = entry.kind


def _plan(archive: Path, label: str, limits: ExtractLimits, room: int) -> list[_Entry]:
    """Every member checked and counted, nothing written: the entries to extract, in order."""
    entries: list[_Entry] = []
    seen: dict[tuple[str, ...], bytes] = {}
    total = 0
    for _, member in _members(archive, label):
        if len(entries) >= limits.max_entries:
            raise ArchiveError(
                f"{label} has more than {limits.max_entries} entries (--max-archive-entries): not extracted"
            )
        parts = _parts(member.name, label)
        if not (member.isfile() or member.isdir() or member.issym()):
            raise ArchiveError(
                f"{label} has an unsafe member: '{_shown(member.name)}' is not a file, directory or symlink"
            )
        if not parts:
            if member.isdir():
                continue  # the archive's root itself ("./")
            raise ArchiveError(f"{label} has an unsafe member path: '{_shown(member.name)}' names the archive's root")
        if len("/".join(parts).encode()) >= room or any(len(p.encode()) > 255 for p in parts):
            raise ArchiveError(f"{label} has a member path too long to extract here: '{_shown(member.name)}'")
        entry = _entry(member, parts)
        _refuse_unsafe(member, entry, seen, label)
        total += entry.size
        if total > limits.max_bytes:
            raise ArchiveError(
                f"{label} holds more than {_size(limits.max_bytes)} once extracted (--max-archive-gib): not extracted"
            )
        entries.append(entry)
    if not entries:
        raise ArchiveError(f"{label} holds no files")
    return entries


def _open_folder(root_fd: int, parts: tuple[str, ...], label: str) -> int:
    """The folder ``parts`` below ``root_fd``, made where missing (readable by all, as a container
    running as another user must read it), opened one part at a time without following a link."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ArchiveError(
                        f"{label} has an unsafe member: '{'/'.join(parts)}' passes through a link"
                    ) from None
                raise
            os.close(fd)
            fd = child
            if made:
                os.fchmod(fd, 0o755)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write(root_fd: int, tar: tarfile.TarFile, member: tarfile.TarInfo, entry: _Entry, label: str) -> None:
    """One member, written below ``root_fd`` without following anything on the way."""
    folder = _open_folder(root_fd, entry.parts[:-1], label)
    name = entry.parts[-1]
    try:
        if entry.kind == tarfile.DIRTYPE:
            os.close(_open_folder(folder, (name,), label))
        elif entry.kind == tarfile.SYMTYPE:
            os.symlink(entry.link, name, dir_fd=folder)
        else:
            source = tar.extractfile(member)
            assert source is not None  # a regular file always has a body
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(name, flags, 0o600, dir_fd=folder), "wb") as out:
                os.fchmod(out.fileno(), 0o755 if entry.executable else 0o644)
                shutil.copyfileobj(source, out, _CHUNK)
    finally:
        os.close(folder)


def _extract(archive: Path, root: Path, entries: list[_Entry], label: str) -> None:
    """Write the checked entries into the empty folder ``root``; the archive must read as it did."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        pending = iter(entries)
        for tar, member in _members(archive, label):
            if not _parts(member.name, label) and member.isdir():
                continue
            entry = next(pending, None)
            kept = member.isfile() or member.isdir() or member.issym()
            if entry is None or not kept or _entry(member, _parts(member.name, label)) != entry:
                raise ArchiveError(f"{label} changed while it was extracted ({AGAIN})")
            try:
                _write(root_fd, tar, member, entry, label)
            except (OSError, tarfile.TarError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ArchiveError(f"{label} could not be extracted: '{_shown(member.name)}': {why}") from None
        if next(pending, None) is not None:
            raise ArchiveError(f"{label} changed while it was extracted ({AGAIN})")
    finally:
        os.close(root_fd)


def _resolve_links(root: Path, entries: list[_Entry], label: str) -> None:
    """Every link resolved strictly: a loop, a path too long or a target that is not there is refused,
    and so is one that (against the checks before) lands outside ``root``."""
    for entry in entries:
        if entry.kind != tarfile.SYMTYPE:
            continue
        name = "/".join(entry.parts)
        try:
            real = Path(os.path.realpath(root / name, strict=True))
        except OSError as exc:
            why = {errno.ELOOP: "is a loop of links", errno.ENAMETOOLONG: "resolves to a path too long"}.get(
                exc.errno or 0, "points to nothing in the archive"
            )
            raise ArchiveError(f"{label} has an unusable member: symlink '{_shown(name)}' {why}") from None
        if real != root and root not in real.parents:
            raise ArchiveError(f"{label} has an unsafe member: symlink '{_shown(name)}' points outside the archive")


def _path_room(folder: Path) -> int:
    """How long a member's path may be below ``folder`` for the whole to stay a usable path."""
    try:
        path_max = os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        path_max = 4096
    return path_max - len(str(folder)) - 1


def safe_extract(
    archive: Path, destination: Path, *, name: str | None = None, limits: ExtractLimits | None = None
) -> None:
    """Extract a model.tar.gz into ``destination`` (which must not exist yet), whole or not at all.

    Refused, as an :class:`ArchiveError` of one line naming the archive (``name``, else its path): an
    empty, non-gzip, truncated or corrupt file, one that is no tar, more bytes or entries than
    ``limits`` allow (or than the disk has free), and members with absolute paths, '..', links that
    are absolute, climb or cannot be resolved, hardlinks or device files. The archive is extracted into
    a fresh folder beside ``destination`` and renamed into place only when complete, so a failure
    leaves nothing behind.
    """
    label = name or str(archive)
    limits = limits or ExtractLimits()
    _check_gzip(archive, label)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent)).resolve()
    try:
        entries = _plan(archive, label, limits, _path_room(partial))
        needed = sum(entry.size for entry in entries)
        free = shutil.disk_usage(partial).free
        if needed > free:
            raise ArchiveError(
                f"{label} needs {_size(needed)} once extracted and {partial.parent} has {_size(free)} free"
            )
        partial.chmod(0o755)  # mkdtemp's 0700 would hide the model from a container running as another user
        _extract(archive, partial, entries, label)
        _resolve_links(partial, entries, label)
        partial.rename(destination)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
