"""What checking a model archive costs is bounded by the archive's limits (entries, bytes, depth, header
sizes), whatever the archive holds; and every archive refused is one line naming it and the limit,
with nothing left behind (for --model-data: no traceback; for a TargetModel: a 400, never a 500)."""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys
import tarfile
import time
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import pytest

from smtriton.local.archive import ArchiveError, ExtractLimits, safe_extract

SMTRITON = str(Path(sys.executable).parent / "smtriton")
MIB = 1 << 20
END = bytes(1024)  # a tar's end: two zero blocks


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> bytes:
    """One member's header (a GNU long name or link before it where needed) and data; a name given with
    surrogates is written as the bytes they stand for."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + _padded(data)


def _extension(kind: bytes, size: int) -> bytes:
    """The header of a GNU long name or a pax header whose data (``size`` bytes) follows."""
    info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "././@PaxHeader")
    info.type, info.size = kind, size
    return info.tobuf(tarfile.USTAR_FORMAT)


def _pax(key: str, value: bytes) -> bytes:
    """A pax header of one record (its length counts its own digits)."""
    body = f" {key}=".encode() + value + b"\n"
    length = len(body) + len(str(len(body)))
    length += len(str(length)) - len(str(len(body)))
    record = str(length).encode() + body
    return _extension(tarfile.XHDTYPE, len(record)) + _padded(record)


def _gz(path: Path, *pieces: bytes | Iterable[bytes]) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as out:
        for piece in pieces:
            for chunk in [piece] if isinstance(piece, bytes) else piece:
                out.write(chunk)
    return path


def _outcome(archive: Path, tmp_path: Path, limits: ExtractLimits | None = None) -> str:
    """The line refusing ``archive``, or '' when it was extracted."""
    try:
        safe_extract(archive, tmp_path / "out" / "model", name="model.tar.gz", limits=limits)
    except ArchiveError as exc:
        return str(exc)
    return ""


def _one_line(message: str, tmp_path: Path) -> str:
    """``message`` refuses the archive in one line naming it, and nothing of it is left."""
    assert message, "the archive was extracted"
    assert "\n" not in message, message
    assert message.startswith("model.tar.gz "), message
    assert len(message) < 400, message
    assert list((tmp_path / "out").iterdir()) == []
    return message


def _refused(archive: Path, tmp_path: Path, limits: ExtractLimits | None = None) -> str:
    return _one_line(_outcome(archive, tmp_path, limits), tmp_path)


def _peak(call: Callable[[], str]) -> tuple[str, int]:
    """What ``call`` returns, and the most memory Python held above the start while it ran."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_members_two_thousand_folders_deep_are_refused_before_their_bookkeeping_grows(tmp_path: Path):
    """Each member of its own path 1,900 folders deep (a 60 kB archive of 300 such filled 2 GiB): the
    first is past the depth limit, and the check has kept next to nothing."""
    deep = "/".join(["d"] * 1_899)
    archive = _gz(tmp_path / "deep.tar.gz", (_member(f"{i}/{deep}/f") for i in range(10)), END)
    message, peak = _peak(lambda: _outcome(archive, tmp_path))
    assert peak < 4 * MIB, peak
    assert "has a member path deeper than 128 levels" in _one_line(message, tmp_path)


def test_the_check_of_deep_paths_costs_what_the_paths_weigh(tmp_path: Path):
    """With the depth limit lifted: 200 members sharing one folder 1,900 deep, and 5 more each in a path
    of its own as deep, are checked in a few megabytes and well under a second (not 25 ms a member, nor
    15 MB), the folders the paths imply counted as entries."""
    shared = "/".join(["d"] * 1_899)
    members = [*(f"{shared}/{i}" for i in range(200)), *(f"{i}/{shared}/f" for i in range(5))]
    archive = _gz(tmp_path / "deep.tar.gz", (_member(name) for name in members), _member("../stop"), END)
    started = time.process_time()
    message, peak = _peak(lambda: _outcome(archive, tmp_path, ExtractLimits(max_depth=2_000)))
    assert time.process_time() - started < 2.0
    assert peak < 16 * MIB, peak
    assert "'../stop' leaves the archive" in _one_line(message, tmp_path)
    implied = 1_899 + 5 * 1_900
    few = ExtractLimits(max_depth=2_000, max_entries=implied)
    assert "more than" in _refused(archive, tmp_path, few)


def test_members_of_one_deep_folder_open_it_once_not_once_each(tmp_path: Path, monkeypatch):
    """300 files in a folder 127 deep: the folder is opened once, not its 127 parts for every file."""
    folder = "/".join(["d"] * 127)
    archive = _gz(tmp_path / "deep.tar.gz", (_member(f"{folder}/{i}", data=b"x") for i in range(300)), END)
    opened = []
    real_open = os.open

    def counting(*args, **kwargs):
        opened.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    safe_extract(archive, tmp_path / "out" / "model")
    monkeypatch.undo()
    assert len(opened) < 2 * 300 + 2 * 128, len(opened)
    assert (tmp_path / "out" / "model" / folder / "299").read_bytes() == b"x"


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE], ids=["gnu-long-name", "pax"])
def test_a_huge_long_name_or_pax_header_is_refused_before_it_is_read(tmp_path: Path, kind: bytes):
    """A 64 MiB extension header in a small archive: refused on its header's size, nothing of it read."""
    size = 64 * MIB
    data = (b"a" * MIB for _ in range(64))
    archive = _gz(tmp_path / "long.tar.gz", _extension(kind, size), data, _member("m/config.pbtxt"), END)
    assert archive.stat().st_size < MIB
    message, peak = _peak(lambda: _outcome(archive, tmp_path))
    assert peak < 8 * MIB, peak
    assert f"has a tar header extension (long name or pax header) of {size} bytes" in _one_line(message, tmp_path)
    assert "more than the 1048576 a header may hold" in message, message


def test_header_bytes_count_against_the_byte_limit(tmp_path: Path):
    """A pax header's 600 kB are inflated like the files: past a 512 KiB limit, the archive is refused
    although its one file holds 3 bytes."""
    archive = _gz(tmp_path / "pax.tar.gz", _pax("comment", b"c" * 600_000), _member("m/config.pbtxt", data=b"x=1"), END)
    message = _refused(archive, tmp_path, ExtractLimits(max_bytes=MIB // 2))
    assert "inflates to more than 0.5 MiB, its tar headers and padding included (--max-archive-gib)" in message


def test_every_dot_slash_member_counts_as_an_entry(tmp_path: Path):
    """3,000 './' members and one file, with room for 1,000 entries: refused, not read to the end."""
    root = _member("./", tarfile.DIRTYPE)
    archive = _gz(tmp_path / "dots.tar.gz", [root] * 3_000, _member("m/config.pbtxt"), END)
    message = _refused(archive, tmp_path, ExtractLimits(max_entries=1_000))
    assert "has more than 1000 entries (--max-archive-entries)" in message, message


def test_inflation_stops_at_the_byte_limit_even_past_the_tars_end(tmp_path: Path):
    """64 MiB of zeros after the tar's end, in the same gzip stream: inflated no further than the limit."""
    zeros = (bytes(MIB) for _ in range(64))
    archive = _gz(tmp_path / "zeros.tar.gz", _member("m/config.pbtxt", data=b"x=1"), END, zeros)
    started = time.process_time()
    message = _refused(archive, tmp_path, ExtractLimits(max_bytes=MIB))
    assert time.process_time() - started < 0.5
    assert "inflates to more than 1 MiB, its tar headers and padding included (--max-archive-gib)" in message
    # The zeros a tar writer pads its last record with are read like the rest, within the limit.
    safe_extract(_gz(tmp_path / "padded.tar.gz", _member("m/config.pbtxt"), END, bytes(20_000)), tmp_path / "ok")


@pytest.mark.parametrize(
    ("member", "shown"),
    [
        (_member("m/w\udcff.bin", data=b"w"), "'m/w\\xff.bin'"),
        (_member("m/link", tarfile.SYMTYPE, link="w\udcfe"), "'w\\xfe'"),
    ],
    ids=["name", "link"],
)
def test_a_member_name_or_link_that_is_not_utf8_is_one_line(tmp_path: Path, member: bytes, shown: str):
    archive = _gz(tmp_path / "bytes.tar.gz", _member("m/config.pbtxt"), member, END)
    message = _refused(archive, tmp_path)
    assert f"has a member name or link that is not UTF-8: {shown}" in message, message


def test_a_target_model_that_is_not_utf8_is_a_400_naming_it(tmp_path: Path):
    """On the multi-model path the same archive is SageMaker's ValidationError, with nothing kept."""
    from smtriton.local.endpoint import ArchiveSource, LoadedModels, _Placement, model_hash

    archives = tmp_path / "archives"
    archives.mkdir()
    _gz(archives / "bytes.tar.gz", _member("m/config.pbtxt"), _member("m/w\udcff.bin", data=b"w"), END)
    work = tmp_path / "work"
    work.mkdir()
    placement = _Placement("local", work, ArchiveSource(str(archives)), LoadedModels(2))
    model_dir = placement.model_root / model_hash("bytes.tar.gz") / "model"
    answer = asyncio.run(placement._extract("bytes.tar.gz", model_dir))
    assert answer is not None
    assert answer.status_code == 400
    assert answer.headers["x-amzn-ErrorType"] == "ValidationError:"
    message = orjson.loads(answer.body)["message"]
    assert message.startswith("bytes.tar.gz has a member name or link that is not UTF-8: 'm/w\\xff.bin'"), message
    assert [p.name for p in work.rglob("*")] == ["models"]


def test_a_tree_past_the_depth_limit_beside_a_dangling_link_is_one_line_and_leaves_nothing(tmp_path: Path):
    """--model-data: a tree 1,500 folders deep and a link to nothing (once a RecursionError traceback
    that left the scratch folder in --work-dir)."""
    deep = "/".join(["d"] * 1_500)
    archive = _gz(
        tmp_path / "model.tar.gz", _member(f"m/{deep}/f", data=b"x"), _member("m/gone", tarfile.SYMTYPE, link="x"), END
    )
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    cmd = [SMTRITON, "local-endpoint", "--model-data", str(archive), "--port", "1", "--work-dir", str(work)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {archive} has a member path deeper than 128 levels"), line
    assert list(work.iterdir()) == []


def test_a_tree_at_the_depth_limit_beside_a_dangling_link_leaves_nothing(tmp_path: Path):
    deep = "/".join(["d"] * 126)
    archive = _gz(
        tmp_path / "model.tar.gz", _member(f"m/{deep}/f", data=b"x"), _member("m/gone", tarfile.SYMTYPE, link="x"), END
    )
    assert "symlink 'm/gone' points to nothing in the archive" in _refused(archive, tmp_path)


def test_a_chain_of_a_thousand_links_is_refused_as_longer_than_the_system_follows(tmp_path: Path):
    """l0 -> l1 -> ... -> l999 -> the file: the kernel follows 40, so no model could open it."""
    links = [_member(f"m/l{i}", tarfile.SYMTYPE, link=f"l{i + 1}") for i in range(1_000)]
    archive = _gz(tmp_path / "chain.tar.gz", _member("m/l1000", data=b"w"), links, END)
    message = _refused(archive, tmp_path)
    assert "symlink 'm/l0' is a loop of links, or a chain of more than the 40 the system follows" in message
    # A chain the kernel follows is kept.
    short = [_member(f"m/l{i}", tarfile.SYMTYPE, link=f"l{i + 1}") for i in range(30)]
    safe_extract(_gz(tmp_path / "short.tar.gz", _member("m/l30", data=b"w"), short, END), tmp_path / "ok")
    assert (tmp_path / "ok" / "m" / "l0").read_bytes() == b"w"


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-long-name"])
def test_thousands_of_extension_headers_before_one_member_are_one_line(tmp_path: Path, kind: bytes):
    """2,000 pax headers (or long names) in a row: once a RecursionError in tarfile."""
    if kind == tarfile.XHDTYPE:
        one = _pax("path", b"m/config.pbtxt")
    else:
        one = _extension(kind, 15) + _padded(b"m/config.pbtxt\0")
    archive = _gz(tmp_path / "chain.tar.gz", [one] * 2_000, _member("m/x"), END)
    assert "has more than 16 tar header extensions in a row" in _refused(archive, tmp_path)
