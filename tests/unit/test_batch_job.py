"""One batch transform job, on AWS and here: `smtriton transform` and `smtriton local-transform` take the
same flags with the same defaults, build the same job of them, and refuse what CreateTransformJob would
refuse (after the model is made) in one line each, before anything asks AWS or starts serve."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from smtriton.aws.batch_job import BatchJob, is_local_storage, transform_instance_types
from smtriton.aws.endpoint_cli import transform_command
from smtriton.aws.transform import TransformSpec, run_transform
from smtriton.local.transform_cli import local_transform

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/smtriton:1"
ROLE = "arn:aws:iam::123456789012:role/sagemaker"
JOB_FLAGS = ("content_type", "split_type", "batch_strategy", "accept", "max_payload_mb", "max_concurrent",
             "instance_type", "kms_key")  # fmt: skip


def test_both_commands_take_the_jobs_flags_with_one_set_of_defaults():
    aws = inspect.signature(transform_command).parameters
    here = inspect.signature(local_transform).parameters
    spec = inspect.signature(TransformSpec).parameters
    for name in JOB_FLAGS:
        default = getattr(BatchJob(), name)
        assert aws[name].default == here[name].default == default, name
        assert aws[name].annotation == here[name].annotation, name
        if name != "kms_key":  # the spec's is its hosting's
            assert spec[name].default == default, name
    # SageMaker's own: an object is one request, and the container says how to batch
    assert (BatchJob().split_type, BatchJob().batch_strategy, BatchJob().content_type) == (
        "None",
        None,
        "application/json",
    )


def commands(tmp_path: Path, flags: list[str]) -> dict[str, list[str]]:
    """Both commands' argument lists for one job's flags."""
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "a.jsonl").write_text("{}\n")
    return {
        "transform": ["transform", "nightly", "--image", IMAGE, "--role", ROLE, "--input", "s3://in/", "--output",
                      "s3://out/", *flags],
        "local-transform": ["local-transform", str(tmp_path / "in"), str(tmp_path / "out"), "--endpoint-url",
                            "http://127.0.0.1:9", *flags],
    }  # fmt: skip


@pytest.fixture
def nothing_starts(monkeypatch):
    def refused(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the command went on past its checks")

    monkeypatch.setattr("smtriton.aws.endpoint_cli.open_session", refused)
    monkeypatch.setattr("smtriton.local.transform_cli._run", refused)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-concurrent", "20", "--max-payload-mb", "10"],
         "MaxConcurrentTransforms * MaxPayloadInMB is 20 * 10 = 200, and SageMaker takes at most 100: lower "
         "--max-concurrent or --max-payload-mb"),
        (["--instance-type", "ml.p4d.24xlarge"], "ml.p4d.24xlarge is not an instance type batch transform runs on"),
        (["--instance-type", "ml.p5.48xlarge"], "ml.p5.48xlarge is not an instance type batch transform runs on"),
        (["--max-payload-mb", "101"], "the maximum payload must be 0-100 MB"),
        (["--split-type", "RecordIO"], "RecordIO splitting sends binary records"),
    ],
)  # fmt: skip
def test_both_commands_refuse_what_create_transform_job_would_in_one_line(tmp_path, nothing_starts, flags, message):
    from smtriton.cli import app

    for name, argv in commands(tmp_path, flags).items():
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == (1 if name == "transform" else 2), (name, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, (name, lines)
        assert lines[0].startswith(f"error: {message}"), (name, lines)


def test_a_kms_key_on_local_nvme_storage_is_said_by_both_commands_and_kept_off_the_volume(tmp_path, monkeypatch):
    from smtriton.cli import app

    jobs: dict[str, BatchJob] = {}

    requests: list[dict[str, Any]] = []

    class SageMaker:
        def create_model(self, **request: Any) -> None:
            pass

        def create_transform_job(self, **request: Any) -> dict[str, str]:
            requests.append(request)
            return {"TransformJobArn": "arn:aws:sagemaker:us-east-1:123456789012:transform-job/nightly"}

    class Session:
        def client(self, name: str) -> Any:
            return SageMaker()

    def aws_job(sm: Any, spec: TransformSpec, **kw: Any) -> Any:
        jobs["transform"] = spec.job
        return run_transform(sm, spec, **kw)

    def local_job(url: str, job: BatchJob, files: Any, output: Path) -> Any:
        jobs["local-transform"] = job
        raise SystemExit(0)

    monkeypatch.setattr("smtriton.aws.endpoint_cli.open_session", lambda region, profile: Session())
    monkeypatch.setattr("smtriton.aws.transform.run_transform", aws_job)
    monkeypatch.setattr("smtriton.local.transform_cli._run", local_job)
    flags = ["--kms-key", "alias/ml", "--content-type", "text/csv", "--split-type", "Line", "--max-payload-mb", "2"]
    for name, argv in commands(tmp_path, flags).items():
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, (name, result.output)
        assert "warning: ml.g5.xlarge stores on local NVMe" in result.stderr, name
    assert jobs["transform"] == jobs["local-transform"]  # the job tried here is the job AWS would run
    (request,) = requests
    assert "VolumeKmsKeyId" not in request["TransformResources"]
    assert request["TransformOutput"]["KmsKeyId"] == "alias/ml"
    assert "BatchStrategy" not in request  # the container's answer decides, here as there


def test_local_nvme_instance_types_are_told_by_their_family():
    offered = transform_instance_types()
    assert "ml.g5.xlarge" in offered
    assert "ml.p4d.24xlarge" not in offered
    for local in ("ml.g4dn.xlarge", "ml.g5.xlarge", "ml.g6.xlarge", "ml.g6e.xlarge", "ml.p4d.24xlarge",
                  "ml.p5.48xlarge", "ml.m5d.large", "ml.p3dn.24xlarge"):  # fmt: skip
        assert is_local_storage(local), local
    for ebs in ("ml.m5.xlarge", "ml.c5.xlarge", "ml.p3.2xlarge", "ml.inf2.xlarge", "ml.m7i.large", "ml.c5n.xlarge"):
        assert not is_local_storage(ebs), ebs
