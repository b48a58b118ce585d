"""What `smtriton validate` (and `package`'s checks) costs to read a packed environment's archive is
bounded as local-endpoint's extraction is (the same reader, tarstream), and every archive it cannot read
is one problem line naming the limit or the damage, never a traceback."""

from __future__ import annotations

import bz2
import gzip
import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from smtriton.repo import validate
from smtriton.repo.validate import errors, validate_repository
from tests.unit.test_archive_bounds import END, MIB, SMTRITON, _extension, _gz, _member, _padded, _pax, _peak
from tests.unit.test_repo_validate import _python_model_with_env

ENV = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
PARTS = (_member("./bin/activate", data=b"export PATH=...\n"), _member("./lib/python3.12/site-packages/x.py"))


def _env_lines(root: Path) -> list[str]:
    """The error lines of the repository ``root``, as validate prints them."""
    return [p.line(root) for p in errors(validate_repository(root, stub_python="3.12"))]


def _one_line(root: Path, says: str) -> str:
    (line,) = _env_lines(root)
    assert line.startswith("packed/env.tar.gz: error: the packed environment "), line
    assert says in line, line
    assert "\n" not in line
    assert len(line) < 300, line
    return line


def _chained(kind: bytes) -> bytes:
    """One extension header that names bin/activate: a pax header or a GNU long name."""
    if kind == tarfile.XHDTYPE:
        return _pax("path", b"bin/activate")
    return _extension(kind, 13) + _padded(b"bin/activate\0")


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-long-name"])
def test_thousands_of_chained_extension_headers_are_one_line_not_a_recursion_error(tmp_path: Path, kind: bytes):
    model = _python_model_with_env(tmp_path, ENV)
    _gz(model / "env.tar.gz", [_chained(kind)] * 3_000, _member("x"), END)
    _one_line(tmp_path, "has more than 16 tar header extensions in a row")


def test_a_300_mib_pax_header_in_a_small_file_is_refused_before_it_is_read(tmp_path: Path):
    model = _python_model_with_env(tmp_path, ENV)
    size = 300 * MIB
    with gzip.open(model / "env.tar.gz", "wb", compresslevel=9) as out:
        out.write(_extension(tarfile.XHDTYPE, size))
        for _ in range(300):
            out.write(bytes(MIB))
        out.write(b"".join(PARTS) + END)
    assert (model / "env.tar.gz").stat().st_size < 400_000
    text, peak = _peak(lambda: "\n".join(_env_lines(tmp_path)))
    assert peak < 8 * MIB, peak
    assert text == _one_line(tmp_path, f"has a tar header extension (long name or pax header) of {size} bytes")


def test_zeros_after_the_tars_end_are_inflated_no_further_than_the_limit(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(validate, "ENV_MAX_BYTES", MIB)
    model = _python_model_with_env(tmp_path, ENV)
    _gz(model / "env.tar.gz", *PARTS, END, (bytes(MIB) for _ in range(64)))
    started = time.process_time()
    line = _one_line(tmp_path, "inflates to more than 1 MiB (its tar headers and padding included)")
    assert time.process_time() - started < 0.5
    assert "the most validate reads of one" in line
    # The zeros a tar writer pads its last record with are read like the rest, within the limit.
    _gz(model / "env.tar.gz", *PARTS, END, bytes(20_000))
    assert _env_lines(tmp_path) == []


def test_members_past_the_limit_are_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(validate, "ENV_MAX_MEMBERS", 100)
    model = _python_model_with_env(tmp_path, ENV)
    _gz(model / "env.tar.gz", *PARTS, (_member(f"f{i}") for i in range(200)), END)
    _one_line(tmp_path, "has more than 100 members, the most validate reads of one")


def test_a_cut_or_damaged_archive_is_named_so_not_taken_for_one_without_bin_activate(tmp_path: Path):
    model = _python_model_with_env(tmp_path, ENV)
    whole = _gz(tmp_path / "whole.tar.gz", *PARTS, _member("./lib/w.bin", data=os.urandom(200_000)), END)
    data = whole.read_bytes()
    (model / "env.tar.gz").write_bytes(data[: len(data) // 2])
    _one_line(tmp_path, "is truncated: its gzip data ends early")
    damaged = bytearray(data)
    damaged[-8] ^= 0xFF  # the CRC in the gzip trailer
    (model / "env.tar.gz").write_bytes(bytes(damaged))
    _one_line(tmp_path, "is corrupt")
    (model / "env.tar.gz").write_bytes(b"")
    _one_line(tmp_path, "is empty")


def test_an_archive_the_python_backend_cannot_read_is_named_so(tmp_path: Path):
    """The Python backend reads a tar, gzip-compressed or not: a bzip2-compressed one is refused there."""
    model = _python_model_with_env(tmp_path, ENV)
    (model / "env.tar.gz").write_bytes(bz2.compress(b"".join(PARTS) + END))
    _one_line(tmp_path, "is neither gzip-compressed nor a tar archive")


def test_an_uncompressed_tar_and_names_that_are_not_utf8_are_read_as_they_are(tmp_path: Path):
    model = _python_model_with_env(tmp_path, ENV)
    (model / "env.tar.gz").write_bytes(b"".join([*PARTS, _member("./lib/w\udcff.bin", data=b"w")]) + END)
    assert _env_lines(tmp_path) == []
    with gzip.open(model / "env.tar.gz", "wb") as out:
        out.write(b"".join([PARTS[0], _member("./lib/python3.10/\udcfe/x.py")]) + END)
    (line,) = _env_lines(tmp_path)
    assert line.startswith("packed/env.tar.gz: error: holds Python 3.10; the Python backend's stub"), line


def _hostile_repository(root: Path) -> None:
    model = _python_model_with_env(root, ENV)
    _gz(model / "env.tar.gz", [_chained(tarfile.GNUTYPE_LONGNAME)] * 3_000, _member("x"), END)


@pytest.mark.parametrize("command", [["validate"], ["package", "sme", "-o", "out.tar.gz"]], ids=["validate", "package"])
def test_the_cli_says_it_in_one_line_without_a_traceback(tmp_path: Path, command: list[str]):
    repo = tmp_path / "repo"
    repo.mkdir()
    _hostile_repository(repo)
    done = subprocess.run([SMTRITON, *command, str(repo)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "packed/env.tar.gz: error: the packed environment has more than 16 tar header extensions in a row"
    ]
    assert not (tmp_path / "out.tar.gz").exists()


def test_a_pax_header_of_an_archive_written_by_tarfile_is_read(tmp_path: Path):
    """tarfile's own pax archives (a long name, non-ASCII names) stay readable, as conda-pack writes them."""
    model = _python_model_with_env(tmp_path, ENV)
    with tarfile.open(model / "env.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name in ("bin/activate", "lib/python3.12/" + "é" * 150 + ".py"):
            info = tarfile.TarInfo(name)
            archive.addfile(info, io.BytesIO(b""))
    assert _env_lines(tmp_path) == []
