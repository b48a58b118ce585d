"""`smtriton transform` against botocore's Stubber: the model and the job it creates (checked against
botocore's service model), the AMI a GPU type gets, following the job to its end, and a failure's
reason in one line; refusals before any call."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from smtriton.aws import ami
from smtriton.aws.hosting import Hosting
from smtriton.aws.resources import DeployError
from smtriton.aws.transform import TransformSpec, run_transform
from tests.unit.aws_stubs import ANY, Clients, arn, valid
from tests.unit.aws_stubs import T0 as CREATED

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/smtriton:1"
ROLE = "arn:aws:iam::123456789012:role/sagemaker"
TAGS = [{"Key": "smtriton:transform-job", "Value": "nightly"}]


def spec(**kw: Any) -> TransformSpec:
    fields: dict[str, Any] = {
        "name": "nightly",
        "image": IMAGE,
        "role_arn": ROLE,
        "model_data": "s3://m/model.tar.gz",
        "input": "s3://in/requests/",
        "output": "s3://out/results/",
    }
    return TransformSpec(**(fields | kw))


def job(status: str, reason: str | None = None) -> dict[str, Any]:
    described = {
        "TransformJobName": "nightly",
        "TransformJobArn": arn("transform-job", "nightly"),
        "TransformJobStatus": status,
        "ModelName": "nightly-new",
        "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://in/requests/"}}},
        "TransformResources": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
        "CreationTime": CREATED,
    }
    if reason:
        described["FailureReason"] = reason
    return described


@pytest.fixture
def clients(monkeypatch):
    monkeypatch.setattr("smtriton.aws.transform.resource_name", lambda base: f"{base}-new")
    with Clients() as stubbed:
        yield stubbed


def test_the_job_and_its_model_with_the_newest_gpu_ami_and_the_options(clients):
    s = spec(
        split_type="Line",
        max_payload_mb=20,
        max_concurrent=4,
        environment={"SAGEMAKER_TRITON_LOG_INFO": "false"},
        default_model="encoder",
        hosting=Hosting(
            subnets=("subnet-0123456789abcdef0",),
            security_groups=("sg-0123456789abcdef0",),
            network_isolation=True,
            kms_key="alias/ml",
        ),
    )
    vpc = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]}
    clients.answer(
        "sagemaker",
        "create_model",
        {"ModelArn": arn("model", "nightly-new")},
        ModelName="nightly-new",
        ExecutionRoleArn=ROLE,
        PrimaryContainer={
            "Image": IMAGE,
            "Mode": "SingleModel",
            "ModelDataUrl": "s3://m/model.tar.gz",
            "Environment": {"SAGEMAKER_TRITON_LOG_INFO": "false", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "encoder"},
        },
        VpcConfig=vpc,
        EnableNetworkIsolation=True,
        Tags=TAGS,
    )
    clients.answer(
        "sagemaker",
        "create_transform_job",
        {"TransformJobArn": arn("transform-job", "nightly")},
        TransformJobName="nightly",
        ModelName="nightly-new",
        MaxPayloadInMB=20,
        MaxConcurrentTransforms=4,
        TransformInput={
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://in/requests/"}},
            "ContentType": "application/json",
            "SplitType": "Line",
        },
        TransformOutput={"S3OutputPath": "s3://out/results/", "AssembleWith": "Line", "KmsKeyId": "alias/ml"},
        TransformResources={  # no VolumeKmsKeyId: a g5's storage is local NVMe, which SageMaker takes none for
            "InstanceType": "ml.g5.xlarge",
            "InstanceCount": 1,
            "TransformAmiVersion": "al2-ami-sagemaker-batch-gpu-535",
        },
        Tags=TAGS,
    )
    messages: list[str] = []
    result = run_transform(clients.sagemaker, s, progress=messages.append)
    assert (result.status, result.model_name) == ("InProgress", "nightly-new")
    assert messages[0] == (
        "warning: ml.g5.xlarge stores on local NVMe, which its hardware encrypts and SageMaker takes no volume KMS "
        "key for: --kms-key encrypts the job's output only"
    )


def test_a_kms_key_encrypts_the_volume_of_an_instance_type_with_one():
    request = valid("sagemaker", "CreateTransformJob",
                    spec(instance_type="ml.m5.xlarge", hosting=Hosting(kms_key="alias/ml")).request("m"))  # fmt: skip
    assert request["TransformResources"]["VolumeKmsKeyId"] == "alias/ml"
    assert request["TransformOutput"]["KmsKeyId"] == "alias/ml"
    assert spec(instance_type="ml.m5.xlarge", hosting=Hosting(kms_key="alias/ml")).validate() == []


def test_waiting_follows_the_job_and_deletes_its_model(clients):
    clients.answer("sagemaker", "create_model", {"ModelArn": arn("model", "nightly-new")})
    clients.answer(
        "sagemaker",
        "create_transform_job",
        {"TransformJobArn": arn("transform-job", "nightly")},
        TransformJobName="nightly",
        ModelName="nightly-new",
        TransformInput=ANY,
        TransformOutput=ANY,
        Tags=TAGS,
        TransformResources={"InstanceType": "ml.m5.xlarge", "InstanceCount": 2},
    )
    for status in ("InProgress", "InProgress", "Completed"):
        clients.answer("sagemaker", "describe_transform_job", job(status), TransformJobName="nightly")
    clients.answer("sagemaker", "delete_model", {}, ModelName="nightly-new")
    messages: list[str] = []
    sleeps: list[float] = []
    result = run_transform(
        clients.sagemaker,
        spec(instance_type="ml.m5.xlarge", instance_count=2),
        wait=True,
        progress=messages.append,
        poll_s=5,
        sleep=sleeps.append,
        clock=lambda: sum(sleeps),
    )
    assert result.status == "Completed"
    assert [m for m in messages if m.startswith("transform job nightly:")] == [
        "transform job nightly: InProgress (0 s)",
        "transform job nightly: InProgress (5 s)",
        "transform job nightly: Completed",
    ]
    assert "deleted model nightly-new" in messages


def test_a_failed_job_is_one_line_with_its_reason_and_exit_1(clients, monkeypatch):
    clients.answer("sagemaker", "create_model", {"ModelArn": arn("model", "nightly-new")})
    clients.answer("sagemaker", "create_transform_job", {"TransformJobArn": arn("transform-job", "nightly")})
    clients.answer("sagemaker", "describe_transform_job", job("InProgress"))
    clients.answer(
        "sagemaker",
        "describe_transform_job",
        job("Failed", "ClientError: See job logs for more information\nthe container answered 400"),
    )
    clients.answer("sagemaker", "delete_model", {}, ModelName="nightly-new")

    class Session:
        def client(self, name: str) -> Any:
            assert name == "sagemaker"
            return clients.sagemaker

    monkeypatch.setattr("smtriton.aws.endpoint_cli.open_session", lambda region, profile: Session())
    monkeypatch.setattr("smtriton.aws.waiting.time.sleep", lambda s: None)
    from smtriton.cli import app

    args = [
        "transform",
        "nightly",
        "--image",
        IMAGE,
        "--role",
        ROLE,
        "--model-data",
        "s3://m/model.tar.gz",
        "--input",
        "s3://in/requests/",
        "--output",
        "s3://out/results/",
        "--wait",
        "--poll",
        "0",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line == (
        "error: transform job nightly is Failed: ClientError: See job logs for more information the "
        "container answered 400"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"split_type": "RecordIO"}, "RecordIO splitting sends binary records"),
        ({"split_type": "TFRecord", "content_type": "application/x-tfrecord"}, "TFRecord splitting sends binary"),
        ({"split_type": "Lines"}, "split type must be one of None, Line"),
        ({"batch_strategy": "Multi"}, "batch strategy must be one of SingleRecord, MultiRecord"),
        (
            {"split_type": "Line", "content_type": "application/vnd.sagemaker-triton.binary+json;json-header-size=9"},
            "are no lines of text",
        ),
        ({"max_payload_mb": 200}, "0-100 MB"),
        ({"input": "/data/requests"}, "must be an s3:// location"),
        ({"ami_version": "al2-ami-sagemaker-batch-gpu-535", "instance_type": "ml.m5.xlarge"}, "has no GPU"),
        ({"ami_version": "al2-ami-sagemaker-batch-gpu-999"}, "not one SageMaker offers"),
        ({"hosting": Hosting(volume_size_gb=10)}, "neither a volume size"),
        ({"hosting": Hosting(subnets=("subnet-0123456789abcdef0",))}, "both --subnet and --security-group"),
        ({"name": "nightly_1"}, "transform job name"),
        ({"max_concurrent": 20, "max_payload_mb": 10}, r"MaxConcurrentTransforms \* MaxPayloadInMB is 20 \* 10 = 200"),
        ({"instance_type": "ml.p4d.24xlarge"}, "ml.p4d.24xlarge is not an instance type batch transform runs on"),
        ({"instance_type": "ml.p5.48xlarge"}, r"its GPU types: .*ml\.g6e\.\*"),
    ],
)
def test_refused_before_any_call(change, message):
    with pytest.raises(DeployError, match=message):
        spec(**change).validate()


def test_the_request_matches_botocores_model_with_and_without_a_gpu():
    for instance_type, version in (("ml.g5.xlarge", "al2-ami-sagemaker-batch-gpu-535"), ("ml.c5.xlarge", None)):
        request = valid("sagemaker", "CreateTransformJob", spec(instance_type=instance_type).request("m"))
        assert request["TransformResources"].get("TransformAmiVersion") == version
    chosen = spec(ami_version="al2-ami-sagemaker-batch-gpu-470").request("m")
    assert chosen["TransformResources"]["TransformAmiVersion"] == "al2-ami-sagemaker-batch-gpu-470"


def test_ami_versions_come_from_botocores_documentation():
    """Newer botocore, newer AMIs: the choice reads the service model, for jobs and endpoints alike."""
    assert {v.name: v.driver for v in ami.versions("transform")} == {
        "al2-ami-sagemaker-batch-gpu-470": 470,
        "al2-ami-sagemaker-batch-gpu-535": 535,
    }
    endpoint = {v.name: v.driver for v in ami.versions("endpoint")}
    assert endpoint["al2-ami-sagemaker-inference-neuron-2"] is None  # not an NVIDIA AMI: never chosen for a GPU
    newest = max((v for v in ami.versions("endpoint") if v.driver), key=lambda v: v.driver or 0).name
    assert ami.choose("endpoint", "ml.g6.xlarge") == newest
    assert ami.choose("endpoint", "ml.inf2.xlarge") is None


@pytest.mark.parametrize(
    ("content_type", "split_type", "given"),
    [
        ("application/jsonlines", "Line", None),
        ("text/csv", "Line", None),
        ("application/json", "None", None),
        ("application/jsonlines", "Line", "SingleRecord"),
        ("application/json", "Line", "MultiRecord"),  # serve reads newline-separated JSON too
    ],
)
def test_a_strategy_not_given_is_left_to_the_containers_execution_parameters(content_type, split_type, given):
    """SageMaker's resolution, which `local-transform` runs: no BatchStrategy in the request, so the
    container's /execution-parameters answer (serve's MULTI_RECORD) decides."""
    s = spec(content_type=content_type, split_type=split_type, batch_strategy=given, accept="application/jsonlines")
    s.validate()
    request = valid("sagemaker", "CreateTransformJob", s.request("m"))
    assert request.get("BatchStrategy") == given
    assert s.job.settle({"BatchStrategy": "MULTI_RECORD"}).strategy == given or "MultiRecord"
    assert request["TransformInput"]["ContentType"] == content_type
    assert request["TransformOutput"] == {
        "S3OutputPath": "s3://out/results/",
        "AssembleWith": split_type,
        "Accept": "application/jsonlines",
    }


def test_the_command_checks_its_arguments_before_it_asks_for_credentials(monkeypatch):
    def no_session(region: str | None, profile: str | None) -> Any:
        raise AssertionError("credentials were asked for")

    monkeypatch.setattr("smtriton.aws.endpoint_cli.open_session", no_session)
    from smtriton.cli import app

    args = ["transform", "nightly", "--image", IMAGE, "--role", ROLE, "--input", "s3://in/", "--output", "s3://out/",
            "--split-type", "RecordIO"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        "error: RecordIO splitting sends binary records, and serve reads a body as one KServe v2 request (JSON or "
        "binary+json) or as lines (JSON Lines, CSV): use Line with JSON Lines or CSV, or None"
    ]
