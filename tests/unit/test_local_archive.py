"""Model archives the local endpoint cannot use: one line naming the archive and what is wrong with it,
nothing half-extracted left behind, and (for --model-data) no traceback from the command."""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from smtriton.local import archive as archives
from smtriton.local.archive import ArchiveError, ExtractLimits, safe_extract

SMTRITON = str(Path(sys.executable).parent / "smtriton")


def _good_archive(path: Path) -> bytes:
    """A model.tar.gz of one model with 300 kB of incompressible weights (so a cut lands inside them)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("m/config.pbtxt", b'name: "m"\n'), ("m/1/weights.bin", os.urandom(300_000))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


def _plain_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("m/config.pbtxt")
        tar.addfile(info, io.BytesIO(b""))
    return out.getvalue()


def _traversal() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return out.getvalue()


def broken(kind: str, good: bytes) -> bytes:
    """The bytes of a broken archive of the given kind, made from a good one."""
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "corrupt":  # the gzip trailer's CRC no longer matches: tarfile alone would not notice
        return good[:-8] + bytes(4) + good[-4:]
    if kind == "not gzip":
        return b"this is a text file, not an archive\n"
    if kind == "uncompressed tar":
        return _plain_tar()
    if kind == "not a tar":
        return gzip.compress(os.urandom(5000))
    if kind == "unsafe":
        return _traversal()
    if kind == "empty":
        return b""
    raise AssertionError(kind)


# What the one line says about each kind.
SAYS = {
    "truncated": "is truncated",
    "corrupt": "is corrupt",
    "not gzip": "is not gzip-compressed",
    "uncompressed tar": "is not gzip-compressed",
    "not a tar": "is not a tar archive",
    "unsafe": "unsafe member path: '../escape.txt'",
    "empty": "is empty",
}


@pytest.mark.parametrize("kind", list(SAYS))
def test_a_broken_archive_is_one_line_naming_it_and_leaves_nothing_behind(tmp_path: Path, kind: str):
    good = _good_archive(tmp_path / "good.tar.gz")
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(broken(kind, good))
    target = tmp_path / "models" / "0123" / "model"
    target.parent.mkdir(parents=True)
    with pytest.raises(ArchiveError) as refused:
        safe_extract(archive, target, name="team/model.tar.gz")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("team/model.tar.gz "), message
    assert SAYS[kind] in message, message
    assert list(target.parent.iterdir()) == []  # no partial folder, no half of the model
    assert not (tmp_path / "escape.txt").exists()


def test_a_good_archive_lands_whole_and_readable(tmp_path: Path):
    _good_archive(tmp_path / "good.tar.gz")
    target = tmp_path / "models" / "0123" / "model"
    safe_extract(tmp_path / "good.tar.gz", target)
    assert (target / "m" / "config.pbtxt").read_bytes() == b'name: "m"\n'
    assert len((target / "m" / "1" / "weights.bin").read_bytes()) == 300_000
    assert target.stat().st_mode & 0o755 == 0o755  # a container running as another user reads it too
    assert [p.name for p in target.parent.iterdir()] == ["model"]


@pytest.mark.parametrize("kind", ["truncated", "not gzip", "not a tar", "unsafe"])
def test_local_endpoint_with_a_broken_model_data_archive_says_why_in_one_line(tmp_path: Path, kind: str):
    """SME: the archive is refused before serve starts; one line, exit 2, the scratch folder gone."""
    good = _good_archive(tmp_path / "good.tar.gz")
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(broken(kind, good))
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    cmd = [SMTRITON, "local-endpoint", "--model-data", str(archive), "--port", "1", "--work-dir", str(work)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {archive} "), line
    assert SAYS[kind] in line, line
    assert list(work.iterdir()) == []


def test_local_endpoint_bounds_what_an_archive_may_hold_with_its_options(tmp_path: Path):
    """--max-archive-gib and --max-archive-entries reach the extraction: one line, exit 2, nothing kept."""
    archive = tmp_path / "model.tar.gz"
    _good_archive(archive)  # 300 kB of weights and a config: two entries
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    for option, says in (
        ("--max-archive-gib=0.0001", "(--max-archive-gib)"),
        ("--max-archive-entries=1", "more than 1 entries"),
    ):
        work = tmp_path / option.split("=")[0].strip("-")
        cmd = [SMTRITON, "local-endpoint", "--model-data", str(archive), "--port", "1", "--work-dir", str(work), option]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert says in line, line
        assert list(work.iterdir()) == []


def test_a_read_only_folder_in_the_archive_still_gets_its_files_and_stays_readable(tmp_path: Path):
    """tarfile's data filter ignores folders' modes (and extractall would set them last anyway)."""
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        folder = tarfile.TarInfo("m")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o555
        tar.addfile(folder)
        info = tarfile.TarInfo("m/config.pbtxt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    target = tmp_path / "out" / "model"
    safe_extract(archive, target)
    assert (target / "m" / "config.pbtxt").read_bytes() == b"x=1"
    assert (target / "m").stat().st_mode & 0o755 == 0o755


def test_archives_from_s3_come_through_the_region_and_profile_given(tmp_path, monkeypatch):
    """--models s3://... reads with the session --region and --profile choose (not boto3's default one)."""
    from typer.testing import CliRunner

    from smtriton.cli import app
    from smtriton.local import cli as local_cli
    from tests.unit.aws_stubs import team_profile

    team_profile(tmp_path, monkeypatch)
    sources = []

    def launch(*args):  # stops the command once the archive source is made: no serve is started
        raise local_cli._Terminated

    monkeypatch.setattr(local_cli, "ArchiveSource", lambda location, s3: sources.append(s3))
    monkeypatch.setattr(local_cli, "_launch", launch)
    args = ["local-endpoint", "--models", "s3://bucket/models", "--region", "ap-south-1", "--profile", "team",
            "--work-dir", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (client,) = sources
    assert client.meta.region_name == "ap-south-1"
    assert client._request_signer._credentials.access_key == "TEAMKEY"


def _add(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _realpath_bypass(path: Path, extracted_in: Path) -> None:
    """The published bypass of tarfile's data filter (CVE-2025-4517): folders with names long enough,
    each reached through a one-letter link, so that the last link, once expanded, passes PATH_MAX and
    ``os.path.realpath`` stops resolving; the links after it then look inside the folder to the filter
    while the kernel follows them out, and a file written through them lands outside."""
    steps = "abcdefghijklmnop"
    path_max = os.pathconf(extracted_in.parent, "PC_PATH_MAX")
    component = "d" * ((path_max - len(str(extracted_in)) - 1) // (len(steps) + 1))
    with tarfile.open(path, "w:gz") as tar:
        prefix = ""
        for step in steps:
            _add(tar, os.path.join(prefix, component), tarfile.DIRTYPE)
            _add(tar, os.path.join(prefix, step), tarfile.SYMTYPE, component)
            prefix = os.path.join(prefix, component)
        long_link = os.path.join(*steps, "l" * 254)
        _add(tar, long_link, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps)))
        _add(tar, "escape", tarfile.SYMTYPE, os.path.join(long_link, ".."))
        _add(tar, "escape/outside.txt", data=b"written outside")


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("link_check", ["on", "off"])
def test_the_published_realpath_bypass_writes_nothing_outside(tmp_path: Path, monkeypatch, link_check: str):
    """Refused before anything is written (its links climb); and with the checks of links and paths
    switched off, the extraction itself follows no link, so the file still cannot land outside."""
    models = tmp_path / "models" / "0123"
    models.mkdir(parents=True)
    archive = tmp_path / "evil.tar.gz"
    # safe_extract writes into a fresh folder beside the destination: ".model-" and 8 random characters.
    _realpath_bypass(archive, models / ".model-xxxxxxxx")
    before = _tree(tmp_path)
    if link_check == "off":
        monkeypatch.setattr(archives, "_refuse_unsafe", lambda member, entry, tree, label: 0)
    with pytest.raises(ArchiveError) as refused:
        safe_extract(archive, models / "model", name="evil.tar.gz")
    assert _tree(tmp_path) == before  # nothing outside, and nothing left inside either
    message = str(refused.value)
    assert "\n" not in message, message
    assert len(message) < 400, message
    if link_check == "on":
        assert "climbs" in message, message
    else:
        assert "passes through a link" in message, message


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([("m/w", tarfile.SYMTYPE, "/etc/passwd")], "points outside the archive or climbs"),
        ([("m/w", tarfile.SYMTYPE, "../x")], "points outside the archive or climbs"),
        ([("m/1/w", tarfile.SYMTYPE, "ok/../../..")], "points outside the archive or climbs"),
        ([("m/w", tarfile.SYMTYPE, "w")], "is a loop of links"),
        ([("m/a", tarfile.SYMTYPE, "b"), ("m/b", tarfile.SYMTYPE, "a")], "is a loop of links"),
        ([("m/w", tarfile.SYMTYPE, "gone")], "points to nothing in the archive"),
        ([("n", tarfile.SYMTYPE, "m"), ("n/x", tarfile.REGTYPE, "")], "lies under"),
        ([("m/x", tarfile.REGTYPE, ""), ("m/x", tarfile.REGTYPE, "")], "appears twice"),
        ([("m/x", tarfile.REGTYPE, ""), ("m", tarfile.SYMTYPE, "n")], "appears twice"),
        ([("m/x", tarfile.LNKTYPE, "/etc/passwd")], "is not a file, directory or symlink"),
    ],
)
def test_links_that_climb_loop_or_lead_nowhere_are_refused_before_they_are_used(
    tmp_path: Path, entries: list, says: str
):
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "m/config.pbtxt", data=b"x")
        for name, kind, link in entries:
            _add(tar, name, kind, link if kind != tarfile.REGTYPE else "")
    with pytest.raises(ArchiveError, match=says):
        safe_extract(archive, tmp_path / "out" / "model")
    assert list((tmp_path / "out").iterdir()) == []


def test_links_inside_the_archive_and_dot_slash_names_still_extract(tmp_path: Path):
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "./", tarfile.DIRTYPE)
        _add(tar, "./m/config.pbtxt", data=b"x=1")
        _add(tar, "./m/1/weights.bin", data=b"w" * 10)
        _add(tar, "./m/1/model.bin", tarfile.SYMTYPE, "weights.bin")
        _add(tar, "./m/current", tarfile.SYMTYPE, "1")
    target = tmp_path / "out" / "model"
    safe_extract(archive, target)
    assert (target / "m" / "1" / "model.bin").read_bytes() == b"w" * 10
    assert (target / "m" / "current" / "weights.bin").is_file()
    assert stat.S_IMODE((target / "m" / "1" / "weights.bin").stat().st_mode) == 0o644


def test_an_archive_past_its_byte_or_entry_limit_is_refused_before_anything_is_written(tmp_path: Path):
    """A small archive of zeros that would fill the disk: its headers are summed first."""
    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for i in range(3):
            _add(tar, f"m/{i}.bin", data=bytes(400_000))
    assert archive.stat().st_size < 10_000
    written = []
    real_write = archives._write
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(archives, "_write", lambda *args: written.append(args) or real_write(*args))
        with pytest.raises(ArchiveError, match=r"more than 1 MiB once extracted \(--max-archive-gib\)"):
            safe_extract(archive, tmp_path / "a" / "model", limits=ExtractLimits(max_bytes=1 << 20))
        with pytest.raises(ArchiveError, match=r"more than 2 entries \(--max-archive-entries\)"):
            safe_extract(archive, tmp_path / "b" / "model", limits=ExtractLimits(max_entries=2))
    assert written == []
    assert list((tmp_path / "a").iterdir()) == list((tmp_path / "b").iterdir()) == []
    # Three files and the folder they lie in: four entries.
    safe_extract(archive, tmp_path / "c" / "model", limits=ExtractLimits(max_bytes=2 << 20, max_entries=4))
    assert (tmp_path / "c" / "model" / "m" / "2.bin").stat().st_size == 400_000
