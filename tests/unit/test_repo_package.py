"""Packaging: byte-identical archives, SME/MME layouts, safe renames through the parsed config, S3 upload."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from typer.testing import CliRunner

from smtriton.cli import app
from smtriton.local.archive import safe_extract
from smtriton.repo.package import (
    DEFAULT_MTIME,
    PackageError,
    package_mme,
    package_sme,
    parse_renames,
    served_model,
    upload,
)
from tests.unit.aws_stubs import moto_credentials, team_profile

SMTRITON = str(Path(sys.executable).parent / "smtriton")
CONFIG = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n' + (
    'input {{ name: "A" data_type: TYPE_FP32 dims: [2] }}\noutput {{ name: "B" data_type: TYPE_FP32 dims: [2] }}\n'
)
MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
ENSEMBLE = """name: "pipe"
platform: "ensemble"
max_batch_size: 4
input { name: "IN" data_type: TYPE_FP32 dims: [2] }
output { name: "OUT" data_type: TYPE_FP32 dims: [2] }
ensemble_scheduling {
  step { model_name: "alpha" model_version: -1 input_map { key: "A" value: "IN" } output_map { key: "B" value: "OUT" } }
}
"""


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    for name in ("beta", "alpha"):  # created out of order on purpose
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / ".build-stamp.json").write_text("{}")  # hidden: never packaged
        (repo / name / "1" / "__pycache__").mkdir()
        (repo / name / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (repo / "alpha" / "labels.txt").write_text("cat\ndog\n")
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(ENSEMBLE)
    (repo / ".build.lock").write_text("")
    return repo


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path)


def members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return tar.getmembers()


def read_member(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


def test_sme_archive_is_the_repository_root_sorted_without_hidden_files(repo, tmp_path):
    archive = package_sme(repo, tmp_path / "out" / "model.tar.gz")
    assert [m.name for m in members(archive.path)] == [
        "alpha", "alpha/1", "alpha/1/model.py", "alpha/config.pbtxt", "alpha/labels.txt",
        "beta", "beta/1", "beta/1/model.py", "beta/config.pbtxt",
        "pipe", "pipe/1", "pipe/config.pbtxt",
    ]  # fmt: skip
    assert archive.models == ("alpha", "beta", "pipe")
    for m in members(archive.path):
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (DEFAULT_MTIME, 0, 0, "", "")
        assert m.mode == (0o755 if m.isdir() else 0o644)
    assert read_member(archive.path, "alpha/config.pbtxt") == (repo / "alpha" / "config.pbtxt").read_bytes()


def test_packaging_twice_gives_byte_identical_archives(repo, tmp_path):
    first = package_sme(repo, tmp_path / "a" / "model.tar.gz")
    for path in repo.rglob("*"):  # new mtimes and a fresh copy: nothing of that may leak into the bytes
        os.utime(path, (1_700_000_000, 1_700_000_000))
    second = package_sme(repo, tmp_path / "b" / "model.tar.gz")
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.sha256 == second.sha256 == hashlib.sha256(first.path.read_bytes()).hexdigest()
    assert first.checksum_path.read_text() == f"{first.sha256}  model.tar.gz\n"


def test_gzip_header_has_no_name_and_no_time(repo, tmp_path):
    data = package_sme(repo, tmp_path / "model.tar.gz").path.read_bytes()
    flags, mtime = data[3], int.from_bytes(data[4:8], "little")
    assert data[:3] == b"\x1f\x8b\x08"
    assert flags == 0
    assert mtime == 0
    assert gzip.decompress(data)  # and it is a valid stream


def test_source_date_epoch_sets_the_entry_times(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1234567890")
    archive = package_sme(repo, tmp_path / "model.tar.gz")
    assert {m.mtime for m in members(archive.path)} == {1234567890}


def test_mme_gives_one_archive_per_model_and_ensembles_carry_their_members(repo, tmp_path):
    archives = package_mme(repo, tmp_path / "mme")
    assert [a.path.name for a in archives] == ["alpha.tar.gz", "beta.tar.gz", "pipe.tar.gz"]
    assert [m.name for m in members(archives[1].path)] == ["beta", "beta/1", "beta/1/model.py", "beta/config.pbtxt"]
    assert archives[2].models == ("pipe", "alpha")
    assert {m.name.split("/")[0] for m in members(archives[2].path)} == {"pipe", "alpha"}
    again = package_mme(repo, tmp_path / "mme2")
    assert [a.sha256 for a in archives] == [a.sha256 for a in again]


def test_rename_rewrites_directory_config_name_and_ensemble_steps(repo, tmp_path):
    archive = package_sme(repo, tmp_path / "model.tar.gz", renames={"alpha": "classifier"})
    names = [m.name for m in members(archive.path)]
    assert "classifier/config.pbtxt" in names
    assert not any(n.startswith("alpha") for n in names)
    config = text_format.Parse(
        read_member(archive.path, "classifier/config.pbtxt").decode(), model_config_pb2.ModelConfig()
    )
    assert config.name == "classifier"
    assert config.backend == "python"
    assert len(config.input) == 1
    pipe = text_format.Parse(read_member(archive.path, "pipe/config.pbtxt").decode(), model_config_pb2.ModelConfig())
    assert [s.model_name for s in pipe.ensemble_scheduling.step] == ["classifier"]
    assert read_member(archive.path, "classifier/labels.txt") == b"cat\ndog\n"  # other files untouched
    assert (repo / "alpha" / "config.pbtxt").read_text() == CONFIG.format(name="alpha")  # the source is not modified


def test_rename_in_mme_names_the_archive(repo, tmp_path):
    archives = package_mme(repo, tmp_path / "mme", models=["pipe"], renames={"pipe": "pipeline"})
    assert [a.path.name for a in archives] == ["pipeline.tar.gz"]
    assert archives[0].models == ("pipeline", "alpha")


@pytest.mark.parametrize(
    ("renames", "message"),
    [({"alpha": "beta"}, "two models the name beta"), ({"gamma": "delta"}, "cannot rename gamma")],
)
def test_bad_renames_are_refused(repo, tmp_path, renames, message):
    with pytest.raises(PackageError, match=message):
        package_sme(repo, tmp_path / "model.tar.gz", renames=renames)
    with pytest.raises(PackageError, match="OLD=NEW"):
        parse_renames(["alpha"])


def test_symlink_leading_out_of_the_model_is_refused(repo, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    (repo / "alpha" / "1" / "weights.bin").symlink_to(secret)
    with pytest.raises(PackageError, match="leads outside its model directory"):
        package_sme(repo, tmp_path / "model.tar.gz")


def test_symlinked_model_directory_is_archived_as_files(repo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (repo / "beta").rename(elsewhere)
    (repo / "beta").symlink_to(elsewhere, target_is_directory=True)
    archive = package_sme(repo, tmp_path / "model.tar.gz", models=["beta"])
    assert all(m.isfile() or m.isdir() for m in members(archive.path))
    assert read_member(archive.path, "beta/1/model.py") == MODEL_PY.encode()


def test_archive_passes_safe_extraction(repo, tmp_path):
    archive = package_sme(repo, tmp_path / "model.tar.gz")
    safe_extract(archive.path, tmp_path / "x")
    assert (tmp_path / "x" / "alpha" / "1" / "model.py").read_text() == MODEL_PY
    assert (tmp_path / "x" / "pipe" / "1").is_dir()  # an ensemble's empty version directory survives


def test_upload_to_s3_with_checksum(repo, tmp_path, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    moto_credentials(monkeypatch)
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        archives = package_mme(repo, tmp_path / "mme")
        uris = upload(archives, "s3://models/endpoints/demo", client=s3)
        assert uris == [f"s3://models/endpoints/demo/{n}.tar.gz" for n in ("alpha", "beta", "pipe")]
        head = s3.head_object(Bucket="models", Key="endpoints/demo/beta.tar.gz", ChecksumMode="ENABLED")
        assert head["Metadata"]["sha256"] == archives[1].sha256
        body = s3.get_object(Bucket="models", Key="endpoints/demo/beta.tar.gz")["Body"].read()
        assert body == archives[1].path.read_bytes()
        with pytest.raises(PackageError, match="failed"):
            upload(archives[:1], "s3://no-such-bucket/x", client=s3)
    with pytest.raises(PackageError, match="not an s3://"):
        upload(archives, "https://example.com/x", client=None)


def test_the_upload_goes_through_the_region_and_profile_given(repo, tmp_path, monkeypatch):
    """`package --s3` is an AWS call like deploy's: --region and --profile choose its session."""
    team_profile(tmp_path, monkeypatch, region="eu-central-1")
    used = []
    monkeypatch.setattr("smtriton.repo.package.upload", lambda archives, uri, client: used.append(client) or [uri])
    out = str(tmp_path / "model.tar.gz")
    result = CliRunner().invoke(app, ["package", "sme", str(repo), "-o", out, "--s3", "s3://b/p", "--profile", "team",
                                      "--region", "eu-west-3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (client,) = used
    assert client.meta.region_name == "eu-west-3"
    assert client._request_signer._credentials.access_key == "TEAMKEY"
    result = CliRunner().invoke(app, ["package", "mme", str(repo), "-o", str(tmp_path / "m"), "--s3", "s3://b/p",
                                      "--profile", "team"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert used[-1].meta.region_name == "eu-central-1"


def test_cli_package_sme_validates_first(repo, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["package", "sme", str(repo), "-o", str(tmp_path / "model.tar.gz"), "--rename", "beta=b2"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "model.tar.gz").is_file()
    assert (tmp_path / "model.tar.gz.sha256").is_file()
    (repo / "beta" / "1" / "model.py").unlink()
    bad = runner.invoke(app, ["package", "sme", str(repo), "-o", str(tmp_path / "bad.tar.gz")])
    assert bad.exit_code == 1
    assert "beta/1/model.py: error: missing: backend python loads 1/model.py" in bad.stdout
    assert not (tmp_path / "bad.tar.gz").exists()
    only_alpha = runner.invoke(app, ["package", "mme", str(repo), "-o", str(tmp_path / "mme"), "-m", "alpha"])
    assert only_alpha.exit_code == 0, only_alpha.output  # beta's problem does not block alpha
    assert sorted(p.name for p in (tmp_path / "mme").iterdir()) == ["alpha.tar.gz", "alpha.tar.gz.sha256"]


def test_an_sme_archive_of_several_models_says_which_default_model_to_name(repo, tmp_path):
    """serve refuses several models without SAGEMAKER_TRITON_DEFAULT_MODEL_NAME: the hint after packaging
    names --default-model (the pipeline no other model calls; renamed as archived)."""
    assert served_model(repo, ["alpha", "beta", "pipe"]) == "pipe"  # alpha is a step of pipe
    assert served_model(repo, ["alpha", "beta"]) == "alpha"
    out = tmp_path / "model.tar.gz"
    several = CliRunner().invoke(app, ["package", "sme", str(repo), "-o", str(out), "--rename", "pipe=pipeline"])
    assert several.exit_code == 0, several.output
    assert several.stderr.splitlines()[-2:] == [
        "3 models in the archive (alpha, beta, pipeline): --default-model names the one /invocations runs",
        f"next: smtriton local-endpoint --model-data {out} --default-model pipeline calls it here; smtriton deploy "
        "--default-model pipeline serves it on SageMaker",
    ]
    one = CliRunner().invoke(app, ["package", "sme", str(repo), "-o", str(out), "-m", "beta"])
    assert one.exit_code == 0, one.output
    assert one.stderr.splitlines()[-1] == (
        f"next: smtriton local-endpoint --model-data {out} calls it here; smtriton deploy serves it on SageMaker"
    )


@pytest.mark.parametrize("kind", ["sme", "mme"])
@pytest.mark.parametrize("validate", ["--validate", "--no-validate"])
def test_cli_package_of_a_folder_that_is_not_there_is_one_line(tmp_path, kind, validate):
    """Through the entry point, as a user types it: one line naming the path, exit 2, nothing written."""
    for missing, says in ((tmp_path / "nope", "does not exist"), (tmp_path / "file.txt", "is a file")):
        if missing.name == "file.txt":
            missing.write_text("not a repository")
        done = subprocess.run(
            [SMTRITON, "package", kind, str(missing), "-o", str(tmp_path / "out"), validate],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr + done.stdout
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: "), line
        assert str(missing) in line, line
        assert says in line, line
        assert not (tmp_path / "out").exists()
