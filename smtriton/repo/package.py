"""Package a model repository as the ``model.tar.gz`` archives SageMaker loads, deterministically.

- SME: one ``model.tar.gz`` whose root is the repository (``<model>/config.pbtxt``, ``<model>/1/...``),
  what SageMaker extracts to ``/opt/ml/model``.
- MME: one ``<model>.tar.gz`` per model holding its directory (an ensemble's archive also holds the
  models its steps use), what ``serve`` loads as a ``TargetModel``.

Same repository, same bytes: entries sorted, fixed mtime/owner/mode, no gzip file name or time, and
a ``.sha256`` beside each archive. Renaming a model rewrites its directory and the ``name`` of the
parsed config (and ensemble steps that use it) through the ModelConfig protobuf, never as text.
Hidden files (build stamps, locks) and Python caches are left out. Upload to S3 is optional (boto3).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from smtriton import model_config
from smtriton.errors import ToolUsageError
from smtriton.model_config import CONFIG_FILE, ConfigParseError, ModelConfig
from smtriton.repo import ensemble, layout
from smtriton.repo.validate import MODEL_NAME

# 1980-01-01T00:00:00Z, as wheels and zip files use: tar tools warn about a zero ("implausibly old") time.
DEFAULT_MTIME = 315532800
# gzip's own default: model weights hardly compress, and level 9 costs about twice the time for ~1 %.
COMPRESS_LEVEL = 6
SME_ARCHIVE = "model.tar.gz"


class PackageError(ToolUsageError, ValueError):
    """The repository or the options cannot be packaged (unknown model, bad rename, link out)."""


@dataclass(frozen=True)
class Archive:
    path: Path
    sha256: str
    size: int
    models: tuple[str, ...]  # model directory names inside, as archived (after renames)

    @property
    def checksum_path(self) -> Path:
        return self.path.with_name(self.path.name + ".sha256")


def source_date_epoch() -> int:
    """``SOURCE_DATE_EPOCH`` (reproducible-builds convention) when set, else 1980-01-01."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.isdigit() else DEFAULT_MTIME


def model_dirs(repo: Path) -> list[str]:
    """Model directories of a repository: visible directories holding a config.pbtxt."""
    return sorted(
        p.name
        for p in Path(repo).iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / CONFIG_FILE).is_file()
    )


def parse_renames(pairs: Iterable[str]) -> dict[str, str]:
    """``["old=new", ...]`` -> mapping; both sides must be valid model names."""
    renames: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not MODEL_NAME.match(old) or not MODEL_NAME.match(new):
            raise PackageError(f"rename {pair!r}: write OLD=NEW with valid model names")
        renames[old] = new
    return renames


def package_sme(
    repo: Path,
    output: Path,
    *,
    models: Sequence[str] | None = None,
    renames: Mapping[str, str] | None = None,
    mtime: int | None = None,
) -> Archive:
    """One archive of the repository root (or of the named models), written atomically to ``output``."""
    repo = Path(repo)
    names = _select(repo, models)
    renames = _check_renames(names, dict(renames or {}))
    entries = _entries(repo, names, renames)
    return _write(Path(output), entries, tuple(renames.get(n, n) for n in names), mtime)


def package_mme(
    repo: Path,
    output_dir: Path,
    *,
    models: Sequence[str] | None = None,
    renames: Mapping[str, str] | None = None,
    mtime: int | None = None,
) -> list[Archive]:
    """One ``<name>.tar.gz`` per model in ``output_dir``; an ensemble's archive carries its members."""
    repo = Path(repo)
    names = _select(repo, models)
    renames = dict(renames or {})
    unknown = sorted(set(renames) - set(model_dirs(repo)))
    if unknown:
        raise PackageError(f"cannot rename {', '.join(unknown)}: no such model in {repo}")
    archives = []
    for name in names:
        members = [name, *_ensemble_members(repo, name)]
        local = {old: new for old, new in renames.items() if old in members}
        _check_renames(members, local)
        archive_name = f"{local.get(name, name)}.tar.gz"
        entries = _entries(repo, members, local)
        archives.append(
            _write(Path(output_dir) / archive_name, entries, tuple(local.get(m, m) for m in members), mtime)
        )
    return archives


def _select(repo: Path, models: Sequence[str] | None) -> list[str]:
    if not repo.is_dir():
        raise PackageError(f"{repo}: not a directory")
    layout.require_repository(repo)
    available = model_dirs(repo)
    if not available:
        raise PackageError(f"{repo}: no model directories (each needs a config.pbtxt)")
    if not models:
        return available
    missing = [m for m in models if m not in available]
    if missing:
        raise PackageError(f"no model {', '.join(missing)} in {repo} (models: {', '.join(available)})")
    return sorted(dict.fromkeys(models))


def _check_renames(names: Sequence[str], renames: dict[str, str]) -> dict[str, str]:
    unknown = sorted(set(renames) - set(names))
    if unknown:
        raise PackageError(f"cannot rename {', '.join(unknown)}: not among the packaged models ({', '.join(names)})")
    final = [renames.get(n, n) for n in names]
    clashes = sorted({n for n in final if final.count(n) > 1})
    if clashes:
        raise PackageError(f"renaming would give two models the name {', '.join(clashes)}")
    return renames


def _ensemble_members(repo: Path, name: str, seen: set[str] | None = None) -> list[str]:
    """Models an ensemble's steps use, recursively, in a stable order (the ensemble itself excluded)."""
    seen = seen if seen is not None else {name}
    config = _read_config(repo / name)
    members: list[str] = []
    for member in ensemble.step_models(config):
        if member in seen:
            continue
        if not (repo / member / CONFIG_FILE).is_file():
            raise PackageError(f"{name}: ensemble step uses {member!r}, which is not in {repo}")
        seen.add(member)
        members += [member, *_ensemble_members(repo, member, seen)]
    return sorted(set(members))


def served_model(repo: Path, names: Sequence[str]) -> str:
    """Of several models in one archive, the one to name as its default: of those no ensemble among them
    calls (what a client invokes), an ensemble first, then by name."""
    called: set[str] = set()
    pipelines: set[str] = set()
    for name in names:
        try:
            steps = ensemble.step_models(_read_config(repo / name))
        except PackageError:  # validation says why; any name will do here
            continue
        called.update(steps)
        pipelines.update([name] if steps else [])
    entries = [name for name in sorted(names) if name not in called]
    return ([n for n in entries if n in pipelines] or entries or sorted(names))[0]


def _read_config(model_dir: Path) -> ModelConfig:
    try:
        return model_config.read(model_dir / CONFIG_FILE)
    except ConfigParseError as exc:
        raise PackageError(f"{exc.path}: does not parse (run smtriton validate): {exc.reason}") from None


def renamed_config(model_dir: Path, new_name: str | None, renames: Mapping[str, str]) -> bytes | None:
    """The config text with the model's name and its ensemble steps renamed; None when nothing changes."""
    config = _read_config(model_dir)
    if new_name is not None and model_config.served_name(config, model_dir) == new_name:
        new_name = None  # already served under that name (an empty name means the directory's)
    changed = model_config.rename(config, new_name, renames)
    return model_config.to_text(config).encode() if changed else None


def _skipped(name: str) -> bool:
    """Hidden files (build stamps, locks, editor files) and Python caches are not part of a model."""
    return name.startswith(".") or name == "__pycache__" or name.endswith((".pyc", ".pyo"))


def _entries(repo: Path, names: Sequence[str], renames: Mapping[str, str]) -> list[tuple[str, Path | bytes | None]]:
    """(archive path, source file | replacement bytes | None for a directory), sorted by archive path."""
    entries: dict[str, Path | bytes | None] = {}
    for name in names:
        root = repo / name
        real_root = root.resolve()
        target = renames.get(name, name)
        entries[target] = None
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            here = Path(dirpath)
            rel_dir = here.relative_to(root).as_posix()
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            for d in dirnames:
                _confined(here / d, real_root, repo)
                real, real_here = (here / d).resolve(), here.resolve()
                if real == real_here or real in real_here.parents:
                    raise PackageError(f"{(here / d).relative_to(repo)}: symbolic link loop")
                entries[_arcname(target, rel_dir, d)] = None
            for f in sorted(filenames):
                if _skipped(f):
                    continue
                path = here / f
                _confined(path, real_root, repo)
                if not path.is_file():
                    raise PackageError(
                        f"{path}: not a regular file (sockets, devices and broken links are not packaged)"
                    )
                entries[_arcname(target, rel_dir, f)] = path
        new_config = renamed_config(root, target if target != name else None, renames)
        if new_config is not None:
            entries[f"{target}/{CONFIG_FILE}"] = new_config
    return sorted(entries.items())


def _arcname(target: str, rel_dir: str, name: str) -> str:
    return str(PurePosixPath(target) / ("" if rel_dir == "." else rel_dir) / name)


def _confined(path: Path, real_root: Path, repo: Path) -> None:
    """A symlink inside a model may point within that model only (the archive must be self-contained)."""
    if path.is_symlink():
        real = path.resolve()
        if real != real_root and real_root not in real.parents:
            raise PackageError(f"{path.relative_to(repo)}: symbolic link leads outside its model directory")


def _write(
    output: Path, entries: list[tuple[str, Path | bytes | None]], models: tuple[str, ...], mtime: int | None
) -> Archive:
    mtime = source_date_epoch() if mtime is None else mtime
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    digest = hashlib.sha256()
    with tmp.open("wb") as raw:
        hashing = _HashingWriter(raw, digest)
        # filename="" and mtime=0: the gzip header carries neither a name nor a time.
        with (
            gzip.GzipFile(filename="", mode="wb", fileobj=hashing, compresslevel=COMPRESS_LEVEL, mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for arcname, source in entries:
                _add(tar, arcname, source, mtime)
    os.replace(tmp, output)
    archive = Archive(output, digest.hexdigest(), output.stat().st_size, models)
    archive.checksum_path.write_text(f"{archive.sha256}  {output.name}\n", encoding="utf-8")
    return archive


def _add(tar: tarfile.TarFile, arcname: str, source: Path | bytes | None, mtime: int) -> None:
    info = tarfile.TarInfo(arcname)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if source is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
        return
    if isinstance(source, bytes):
        info.size, info.mode = len(source), 0o644
        tar.addfile(info, io.BytesIO(source))
        return
    st = source.stat()
    info.size = st.st_size
    info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    with source.open("rb") as f:
        tar.addfile(info, f)


class _HashingWriter:
    """A file object that hashes what passes through (so the checksum costs no second read)."""

    def __init__(self, raw: Any, digest: Any) -> None:
        self.raw, self.digest = raw, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def upload(archives: Sequence[Archive], s3_uri: str, client: Any) -> list[str]:
    """Upload each archive to ``s3://bucket/prefix/<archive name>`` with its sha256 checked by S3.

    For an SME the URI of ``model.tar.gz`` is the model's ModelDataUrl; for an MME the prefix is.
    """
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?", s3_uri)
    if not match:
        raise PackageError(f"{s3_uri!r} is not an s3://bucket[/prefix] URI")
    bucket, prefix = match.group(1), (match.group(2) or "")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    uris = []
    for archive in archives:
        key = f"{prefix}{archive.path.name}"
        try:
            client.upload_file(
                str(archive.path),
                bucket,
                key,
                ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": archive.sha256}},
            )
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            raise PackageError(f"upload of {archive.path.name} to s3://{bucket}/{key} failed: {exc}") from None
        uris.append(f"s3://{bucket}/{key}")
    return uris
