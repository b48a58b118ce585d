"""Model archives (model.tar.gz) extracted for the local endpoint: whole or not at all, never outside.

An archive is read twice, by our own reader (``tarstream``: no header or extension is read before its
size is checked, and no byte is inflated past the byte limit). First every member's header is checked
with nothing written: every path, link target and type; the members, and the folders their paths
imply, are counted against the entry limit, their depth against the depth limit and their sizes summed
against the byte limit, before the first byte lands; then the rest of the gzip stream is read, so that
a cut or damaged file (its CRC) is refused too. What the check keeps is a tree of the names and a
digest of each member, so its memory follows the entries, not the paths' lengths. Second, the members
are written into a fresh folder by our own code, one ``openat`` at a time with ``O_NOFOLLOW``: nothing
on the way is followed, so a link the archive made can never redirect a later member, whatever the
link says. Each member must be the one the check saw.

tarfile's own ``data`` filter is not relied on: it resolves links with ``os.path.realpath``, which
stops resolving at ``PATH_MAX``, so a chain of long folder names and links makes a later member land
anywhere the process can write (CVE-2025-4517; every CPython with extraction filters before 3.9.23,
3.10.18, 3.11.13, 3.12.11 and 3.13.4). Here a link is refused when its target is absolute or holds a
``..``, before anything is extracted, and every link is resolved strictly once the archive is out
(a loop, a chain longer than the system follows, a path too long or a target that is not there:
refused).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from smtriton.errors import ToolUsageError
from smtriton.repo.tarstream import AGAIN, Member, Overflow, TarStream, Unreadable, open_tar

GIB = 1 << 30
# The defaults of local-endpoint's --max-archive-gib and --max-archive-entries.
DEFAULT_MAX_BYTES = 32 * GIB
DEFAULT_MAX_ENTRIES = 100_000
# A model's files lie a few folders deep (a packed Python environment, some twenty): past this a tree
# is no model, and what it costs to check, write and remove grows with it.
DEFAULT_MAX_DEPTH = 128
# The links the kernel follows in one path (Linux's MAXSYMLINKS): a longer chain can never be opened.
MAX_LINKS = 40


class ArchiveError(ToolUsageError, ValueError):
    """An archive that cannot be extracted safely, or that does not exist."""


@dataclass(frozen=True)
class ExtractLimits:
    """What one archive may hold: bytes inflated (its files, as their headers say before any is
    written, and its tar headers and padding), entries (members, and folders their paths imply) and
    levels of a member's path (which also bound the recursion of removing a refused tree: keep it
    well under the interpreter's recursion limit)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_entries: int = DEFAULT_MAX_ENTRIES
    max_depth: int = DEFAULT_MAX_DEPTH


@dataclass(frozen=True)
class _Entry:
    """One member as the check saw it: its path's parts, its kind, size and link target."""

    parts: tuple[str, ...]
    kind: bytes
    size: int
    link: str
    executable: bool


# The names the archive makes: a folder is its own tree, a file or link its kind.
_Tree = dict[str, "_Tree | bytes"]


@dataclass
class _Plan:
    """What the check keeps: a digest of each member to extract, the tree of names, the entries counted
    and the bytes of the files."""

    digests: list[bytes] = field(default_factory=list)
    tree: _Tree = field(default_factory=dict)
    entries: int = 0
    size: int = 0


def _size(count: int) -> str:
    return f"{count / GIB:.4g} GiB" if count >= GIB else f"{count / (1 << 20):.4g} MiB"


def _shown(name: str) -> str:
    """A name as a message shows it, on one line: bytes that are not UTF-8 and characters that do not
    print are escaped, and a name of thousands of characters is cut."""
    text = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


@contextlib.contextmanager
def _reading(label: str, limits: ExtractLimits) -> Iterator[None]:
    """What the reader finds wrong said as one line naming the archive."""
    try:
        yield
    except Unreadable as exc:
        raise ArchiveError(f"{label} {exc}") from None
    except Overflow:
        raise ArchiveError(
            f"{label} inflates to more than {_size(limits.max_bytes)}, its tar headers and padding included "
            "(--max-archive-gib): not extracted"
        ) from None


def _parts(name: str, label: str) -> tuple[str, ...]:
    """A member's path as its parts below the archive's root (``./`` and ``.`` dropped); refused when it
    is absolute, climbs or holds a NUL."""
    if name.startswith("/") or "\0" in name:
        raise ArchiveError(f"{label} has an unsafe member path: '{_shown(name)}' leaves the archive")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ArchiveError(f"{label} has an unsafe member path: '{_shown(name)}' leaves the archive")
    return parts


def _check_link(member: Member, label: str) -> None:
    """A symlink may only point down from where it is: a relative target without '..'."""
    target = member.link
    if not target or "\0" in target or target.startswith("/") or ".." in target.split("/"):
        raise ArchiveError(
            f"{label} has an unsafe member: symlink '{_shown(member.name)}' points outside the archive or climbs "
            f"('{_shown(target)}'; a link must be relative and without '..')"
        )


def _entry(member: Member, parts: tuple[str, ...]) -> _Entry:
    if member.kind == tarfile.SYMTYPE:
        return _Entry(parts, member.kind, 0, member.link, False)
    return _Entry(parts, member.kind, member.size, "", bool(member.mode & stat.S_IXUSR))


def _digest(entry: _Entry) -> bytes:
    return hashlib.blake2b(repr(entry).encode(), digest_size=16).digest()


def _refuse_unsafe(member: Member, entry: _Entry, tree: _Tree, label: str) -> int:
    """What the extraction must never be asked to do: follow a link that is absolute or climbs, write
    under a file or a link, or write one name twice. ``tree``: the names before this one, which it
    joins. The number of folders its path makes that no member before it did."""
    if entry.kind == tarfile.SYMTYPE:
        _check_link(member, label)
    made = 0
    node = tree
    for part in entry.parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
            made += 1
        if not isinstance(child, dict):
            raise ArchiveError(f"{label} has an unsafe member: '{_shown(member.name)}' lies under a file or symlink")
        node = child
    name = entry.parts[-1]
    if name in node and not (entry.kind == tarfile.DIRTYPE and isinstance(node[name], dict)):
        raise ArchiveError(f"{label} has an unsafe member: '{_shown(member.name)}' appears twice")
    node.setdefault(name, {} if entry.kind == tarfile.DIRTYPE else entry.kind)
    return made


def _checked_parts(member: Member, label: str, limits: ExtractLimits, room: int) -> tuple[str, ...]:
    """The member's path, refused when it is not UTF-8, unsafe, too deep or too long, or when the
    member is no file, folder or link."""
    for text in (member.name, member.link):
        try:
            text.encode()
        except UnicodeEncodeError:
            raise ArchiveError(f"{label} has a member name or link that is not UTF-8: '{_shown(text)}'") from None
        if len(text) > 2 * room:  # however many "./" it holds, not a path that fits: not worth splitting
            raise ArchiveError(f"{label} has a member path too long to extract here: '{_shown(member.name)}'")
    parts = _parts(member.name, label)
    if member.kind == tarfile.GNUTYPE_SPARSE:
        raise ArchiveError(
            f"{label} has a sparse file, which is not extracted: '{_shown(member.name)}' (pack it without --sparse)"
        )
    if member.kind not in (tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE):
        raise ArchiveError(f"{label} has an unsafe member: '{_shown(member.name)}' is not a file, directory or symlink")
    if len(parts) > limits.max_depth:
        raise ArchiveError(
            f"{label} has a member path deeper than {limits.max_depth} levels (the most an archive may nest): "
            f"'{_shown(member.name)}'"
        )
    if len("/".join(parts).encode()) >= room or any(len(p.encode()) > 255 for p in parts):
        raise ArchiveError(f"{label} has a member path too long to extract here: '{_shown(member.name)}'")
    return parts


def _count(plan: _Plan, entries: int, label: str, limits: ExtractLimits) -> None:
    plan.entries += entries
    if plan.entries > limits.max_entries:
        raise ArchiveError(
            f"{label} has more than {limits.max_entries} entries (--max-archive-entries): not extracted (a folder "
            "its paths imply counts as one)"
        )


def _plan(archive: Path, label: str, limits: ExtractLimits, room: int) -> _Plan:
    """Every member checked and counted, nothing written; then the rest of the gzip stream read."""
    plan = _Plan()
    with _reading(label, limits), open_tar(archive, limits.max_bytes) as tar:
        for member in tar.members():
            _count(plan, 1, label, limits)
            parts = _checked_parts(member, label, limits, room)
            if not parts:
                if member.kind == tarfile.DIRTYPE:
                    continue  # the archive's root itself ("./")
                raise ArchiveError(
                    f"{label} has an unsafe member path: '{_shown(member.name)}' names the archive's root"
                )
            entry = _entry(member, parts)
            _count(plan, _refuse_unsafe(member, entry, plan.tree, label), label, limits)
            plan.size += entry.size
            if plan.size > limits.max_bytes:
                raise ArchiveError(
                    f"{label} holds more than {_size(limits.max_bytes)} once extracted (--max-archive-gib): "
                    "not extracted"
                )
            plan.digests.append(_digest(entry))
        tar.finish()
    if not plan.digests:
        raise ArchiveError(f"{label} holds no files")
    return plan


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


class _Folders:
    """The folder each member lands in, opened below the root without following a link. The last one
    stays open: the members of one folder come one after another, however deep it lies."""

    def __init__(self, root_fd: int, label: str) -> None:
        self.root_fd, self.label = root_fd, label
        self.parts: tuple[str, ...] | None = None
        self.fd = -1

    def open(self, parts: tuple[str, ...]) -> int:
        if parts != self.parts:
            fd = _open_folder(self.root_fd, parts, self.label)
            self.close()
            self.parts, self.fd = parts, fd
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.parts, self.fd = None, -1


def _write(folders: _Folders, tar: TarStream, entry: _Entry, label: str) -> None:
    """One member, written below the root without following anything on the way."""
    folder = folders.open(entry.parts[:-1])
    name = entry.parts[-1]
    if entry.kind == tarfile.DIRTYPE:
        os.close(_open_folder(folder, (name,), label))
    elif entry.kind == tarfile.SYMTYPE:
        os.symlink(entry.link, name, dir_fd=folder)
    else:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(name, flags, 0o600, dir_fd=folder), "wb", buffering=0) as out:
            os.fchmod(out.fileno(), 0o755 if entry.executable else 0o644)
            for chunk in tar.data():
                out.write(chunk)


def _extract(archive: Path, root: Path, plan: _Plan, label: str, limits: ExtractLimits) -> None:
    """Write the checked members into the empty folder ``root``; the archive must read as it did."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    folders = _Folders(root_fd, label)
    try:
        pending = iter(plan.digests)
        with _reading(label, limits), open_tar(archive, limits.max_bytes) as tar:
            for member in tar.members():
                parts = _parts(member.name, label)
                if not parts and member.kind == tarfile.DIRTYPE:
                    continue
                entry = _entry(member, parts)
                if not parts or next(pending, None) != _digest(entry):
                    raise ArchiveError(f"{label} changed while it was extracted ({AGAIN})")
                try:
                    _write(folders, tar, entry, label)
                except OSError as exc:
                    why = exc.strerror or str(exc)
                    raise ArchiveError(f"{label} could not be extracted: '{_shown(member.name)}': {why}") from None
            tar.finish()
        if next(pending, None) is not None:
            raise ArchiveError(f"{label} changed while it was extracted ({AGAIN})")
    finally:
        folders.close()
        os.close(root_fd)


def _links(tree: _Tree) -> Iterator[str]:
    """The path of every link in ``tree``, depth first, without recursion (a tree may be deep)."""
    path: list[str] = []
    stack = [iter(tree.items())]
    while stack:
        for name, child in stack[-1]:
            if isinstance(child, dict):
                path.append(name)
                stack.append(iter(child.items()))
                break
            if child == tarfile.SYMTYPE:
                yield "/".join((*path, name))
        else:
            stack.pop()
            if stack:
                path.pop()


def _resolve_links(root: Path, tree: _Tree, label: str) -> None:
    """Every link resolved strictly: a loop, a chain longer than the kernel follows, a path too long or a
    target that is not there is refused, and so is one that (against the checks before) lands outside
    ``root``. The kernel resolves first, so ``realpath`` (recursive before Python 3.13) never follows
    more than ``MAX_LINKS``."""
    for name in _links(tree):
        try:
            os.stat(root / name)
            real = Path(os.path.realpath(root / name, strict=True))
        except OSError as exc:
            why = {
                errno.ELOOP: f"is a loop of links, or a chain of more than the {MAX_LINKS} the system follows",
                errno.ENAMETOOLONG: "resolves to a path too long",
            }.get(exc.errno or 0, "points to nothing in the archive")
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
    empty, non-gzip, truncated or corrupt file, one that is no tar, more bytes, entries or depth than
    ``limits`` allow (or bytes than the disk has free), a tar header extension past its bound, and
    members with absolute paths, '..', names that are not UTF-8, links that are absolute, climb or
    cannot be resolved, hardlinks, device or sparse files. What the check costs is bounded by
    ``limits``. The archive is extracted into a fresh folder beside ``destination`` and renamed into
    place only when complete, so a failure leaves nothing behind.
    """
    label = name or str(archive)
    limits = limits or ExtractLimits()
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent)).resolve()
    try:
        plan = _plan(archive, label, limits, _path_room(partial))
        free = shutil.disk_usage(partial).free
        if plan.size > free:
            raise ArchiveError(
                f"{label} needs {_size(plan.size)} once extracted and {partial.parent} has {_size(free)} free"
            )
        partial.chmod(0o755)  # mkdtemp's 0700 would hide the model from a container running as another user
        _extract(archive, partial, plan, label, limits)
        _resolve_links(partial, plan.tree, label)
        partial.rename(destination)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
