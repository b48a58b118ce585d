"""ECR push and SageMaker deployment against moto in server mode: real boto3 over HTTP, no AWS account.

Every AWS call of `push_image`, `deploy` and `delete_endpoint` goes to a ThreadedMotoServer on a free
loopback port. The parameters boto3 sends are recorded (botocore validates them against the service
models, so required fields are present and well-typed) and compared with what SageMaker needs; what moto
stored is read back through the same API. Docker is never run: a recording runner stands in for it.

moto does not implement UpdateEndpoint and always reports endpoints InService, so the fixture below
teaches the server (in this process) UpdateEndpoint and lets a test script a sequence of endpoint
states (Creating..., Failed with a reason).
"""

from __future__ import annotations

import base64
import copy
import logging
from pathlib import Path

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from smtriton.aws.deploy import (
    MANAGED_TAG,
    AsyncInference,
    AutoScaling,
    Aws,
    DeployError,
    EndpointSpec,
    Serverless,
    WaitTimeout,
)
from smtriton.aws.deploy import delete_endpoint as delete
from smtriton.aws.deploy import deploy as deploy_endpoint
from smtriton.aws.docker_image import BuildSpec, RecordingRunner, build_argv, sagemaker_triton_image
from smtriton.aws.ecr import push_image

pytestmark = pytest.mark.integration

ACCOUNT = "123456789012"
REGION = "us-east-1"
REGISTRY = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
IMAGE = f"{REGISTRY}/smtriton:1"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/sagemaker-execution"
GPU = "ml.g4dn.xlarge"  # moto's list of instance types predates g5


class Scripted:
    """Endpoint states the patched server reports before the real one, and UpdateEndpoint's outcome."""

    def __init__(self) -> None:
        self.statuses: dict[str, list[tuple[str, str | None]]] = {}
        self.fail_update: str | None = None
        self.updates: list[tuple[str, str]] = []


@pytest.fixture(scope="module")
def scripted() -> Scripted:
    return Scripted()


@pytest.fixture(scope="module")
def moto_url(scripted: Scripted):
    from moto.core.responses import ActionResult
    from moto.sagemaker.models import SageMakerModelBackend
    from moto.sagemaker.responses import SageMakerResponse

    original_describe = SageMakerModelBackend.describe_endpoint

    def describe_endpoint(self, endpoint_name):
        described = original_describe(self, endpoint_name)
        queue = scripted.statuses.get(endpoint_name)
        if queue:
            status, reason = queue.pop(0)
            described = dict(described, EndpointStatus=status)
            if reason:
                described["FailureReason"] = reason
        return described

    def update_endpoint(self):
        backend = self.sagemaker_backend
        name, config_name = self._get_param("EndpointName"), self._get_param("EndpointConfigName")
        endpoint = backend.endpoints[name]
        config = backend.describe_endpoint_config(config_name)
        scripted.updates.append((name, config_name))
        if scripted.fail_update:  # SageMaker rolls back: the previous configuration keeps serving
            endpoint.failure_reason = scripted.fail_update
        else:
            endpoint.endpoint_config_name = config_name
            endpoint.production_variants = endpoint._process_production_variants(config["ProductionVariants"])
        return ActionResult({"EndpointArn": endpoint.arn})

    patch = pytest.MonkeyPatch()
    patch.setattr(SageMakerModelBackend, "describe_endpoint", describe_endpoint)
    patch.setattr(SageMakerResponse, "update_endpoint", update_endpoint, raising=False)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    patch.undo()


class Calls:
    """The API parameters boto3 sends, per operation, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict]] = []

    def __call__(self, params, model, **_):
        self.items.append((model.name, copy.deepcopy(params)))

    def of(self, operation: str) -> list[dict]:
        return [params for name, params in self.items if name == operation]

    def names(self) -> list[str]:
        return [name for name, _ in self.items]


@pytest.fixture
def session(moto_url, scripted, monkeypatch):
    requests.post(f"{moto_url}/moto-api/reset", timeout=10).raise_for_status()
    scripted.statuses.clear()
    scripted.fail_update = None
    scripted.updates.clear()
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def aws(session, moto_url, calls) -> Aws:
    config = Config(retries={"max_attempts": 1})
    clients = Aws(
        sagemaker=session.client("sagemaker", endpoint_url=moto_url, config=config),
        autoscaling=session.client("application-autoscaling", endpoint_url=moto_url, config=config),
    )
    clients.sagemaker.meta.events.register("before-parameter-build", calls)
    clients.autoscaling.meta.events.register("before-parameter-build", calls)
    return clients


class Run:
    """Records progress and sleeps; its clock moves only when the code sleeps, so elapsed times are exact."""

    def __init__(self, aws: Aws) -> None:
        self.aws, self.messages, self.sleeps = aws, [], []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def clock(self) -> float:
        return sum(self.sleeps)

    def deploy(self, spec: EndpointSpec, **kw):
        return deploy_endpoint(
            self.aws, spec, progress=self.messages.append, poll_s=0.5, sleep=self.sleep, clock=self.clock, **kw
        )

    def delete(self, name: str, **kw):
        return delete(
            self.aws, name, progress=self.messages.append, poll_s=0.5, sleep=self.sleep, clock=self.clock, **kw
        )


@pytest.fixture
def run(aws) -> Run:
    return Run(aws)


def sme(name: str = "demo", **kw) -> EndpointSpec:
    fields = {"image": IMAGE, "role_arn": ROLE, "model_data": "s3://models/demo/model.tar.gz", "instance_type": GPU}
    return EndpointSpec(name=name, **(fields | kw))


def exists(call, **kw) -> bool:
    try:
        call(**kw)
        return True
    except ClientError:
        return False


# --- ECR ------------------------------------------------------------------------------------------------


def _password(session, moto_url) -> str:
    token = session.client("ecr", endpoint_url=moto_url).get_authorization_token()["authorizationData"][0]
    return base64.b64decode(token["authorizationToken"]).decode().partition(":")[2]


def test_push_builds_creates_the_repository_logs_in_tags_pushes_and_returns_the_uri(session, moto_url):
    runner = RecordingRunner()
    build = BuildSpec(tag="smtriton:v1", context=Path("/ctx"))
    result = push_image(session, "smtriton", "v1", runner, build=build, endpoint_url=moto_url)

    uri = f"{REGISTRY}/smtriton:v1"
    assert (result.image_uri, result.created_repository) == (uri, True)
    assert runner.argvs == [
        ["docker", "buildx", "version"],
        build_argv(build),
        ["docker", "login", "--username", "AWS", "--password-stdin", REGISTRY],
        ["docker", "tag", "smtriton:v1", uri],
        ["docker", "push", uri],
    ]
    password = _password(session, moto_url)
    assert runner.calls[2][1] == password.encode()  # the token goes through stdin ...
    assert not any(password in arg for argv in runner.argvs for arg in argv)  # ... never the command line
    repo = session.client("ecr", endpoint_url=moto_url).describe_repositories(repositoryNames=["smtriton"])
    assert repo["repositories"][0]["imageScanningConfiguration"] == {"scanOnPush": True}

    again = RecordingRunner()
    second = push_image(session, "smtriton", "v2", again, local_image="smtriton:v1", endpoint_url=moto_url)
    assert (second.image_uri, second.created_repository) == (f"{REGISTRY}/smtriton:v2", False)
    assert [argv[1] for argv in again.argvs] == ["login", "tag", "push"]


@pytest.mark.parametrize("base_region", [REGION, "us-west-2"])
def test_push_on_sagemakers_triton_base_logs_in_to_the_base_registry_before_building(session, moto_url, base_region):
    base = sagemaker_triton_image(base_region)
    runner = RecordingRunner()
    build = BuildSpec(tag="smtriton:gpu-mme", base_image=base, context=Path("/ctx"))
    push_image(session, "smtriton", "gpu-mme", runner, build=build, endpoint_url=moto_url)
    assert runner.argvs[0] == [
        "docker", "login", "--username", "AWS", "--password-stdin", f"763104351884.dkr.ecr.{base_region}.amazonaws.com"
    ]  # fmt: skip
    assert runner.argvs[2] == build_argv(build)
    assert f"BASE_IMAGE={base}" in runner.argvs[2]
    assert [argv[1] for argv in runner.argvs[3:]] == ["login", "tag", "push"]


# --- SageMaker ------------------------------------------------------------------------------------------


def test_sme_deploy_sends_the_required_fields_waits_with_progress_and_is_in_service(run, aws, calls, scripted):
    scripted.statuses["demo"] = [("Creating", None), ("Creating", None)]
    result = run.deploy(sme(default_model="resnet", startup_timeout_s=600))

    (model,) = calls.of("CreateModel")
    assert model == {
        "ModelName": result.model_name,
        "ExecutionRoleArn": ROLE,
        "PrimaryContainer": {
            "Image": IMAGE,
            "Mode": "SingleModel",
            "ModelDataUrl": "s3://models/demo/model.tar.gz",
            "Environment": {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "resnet"},
        },
        "Tags": [{"Key": MANAGED_TAG, "Value": "demo"}],
    }
    (config,) = calls.of("CreateEndpointConfig")
    assert config["EndpointConfigName"] == result.config_name
    assert config["ProductionVariants"] == [
        {
            "VariantName": "AllTraffic",
            "ModelName": result.model_name,
            "InstanceType": GPU,
            "InitialInstanceCount": 1,
            "InitialVariantWeight": 1.0,
            # a GPU type runs the AMI with the newest NVIDIA driver: it runs every image's CUDA
            "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
            "ContainerStartupHealthCheckTimeoutInSeconds": 600,
        }
    ]
    (endpoint,) = calls.of("CreateEndpoint")
    assert endpoint == {"EndpointName": "demo", "EndpointConfigName": result.config_name, "Tags": model["Tags"]}
    assert calls.names()[:4] == ["DescribeEndpoint", "CreateModel", "CreateEndpointConfig", "CreateEndpoint"]

    sm = aws.sagemaker
    stored = sm.describe_model(ModelName=result.model_name)
    assert stored["PrimaryContainer"]["Image"] == IMAGE
    assert stored["ExecutionRoleArn"] == ROLE
    described = sm.describe_endpoint(EndpointName="demo")
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == ("InService", result.config_name)
    assert sm.list_tags(ResourceArn=described["EndpointArn"])["Tags"] == [{"Key": MANAGED_TAG, "Value": "demo"}]

    assert [m for m in run.messages if m.startswith("endpoint demo:")] == [
        "endpoint demo: Creating (0 s)",
        "endpoint demo: Creating (0 s)",
        "endpoint demo: InService",
    ]
    assert run.sleeps == [0.5, 0.5]
    assert not result.updated


def test_mme_deploy_with_auto_scaling_and_the_gpu_base_warning(run, aws, calls):
    spec = sme(
        "mme-demo",
        multi_model=True,
        model_data="s3://models/mme",
        instance_count=2,
        autoscaling=AutoScaling(min_capacity=2, max_capacity=5, target=300),
    )
    result = run.deploy(spec)

    container = aws.sagemaker.describe_model(ModelName=result.model_name)["PrimaryContainer"]
    assert container["Mode"] == "MultiModel"
    assert container["ModelDataUrl"] == "s3://models/mme/"
    assert container["Environment"] == {"SAGEMAKER_MULTI_MODEL": "true"}
    assert any(m.startswith("warning: GPU multi-model endpoint") for m in run.messages)

    (target,) = calls.of("RegisterScalableTarget")
    assert target == {
        "ServiceNamespace": "sagemaker",
        "ResourceId": "endpoint/mme-demo/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 2,
        "MaxCapacity": 5,
    }
    assert calls.names().index("RegisterScalableTarget") > calls.names().index("CreateEndpoint")
    (policy,) = aws.autoscaling.describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId="endpoint/mme-demo/variant/AllTraffic"
    )["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert tracking["TargetValue"] == 300.0
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"


def test_a_failed_create_is_reported_and_rolled_back(run, aws, scripted):
    scripted.statuses["broken"] = [("Creating", None), ("Failed", "The primary container did not pass the ping check")]
    with pytest.raises(DeployError, match="Failed: The primary container did not pass the ping check"):
        run.deploy(sme("broken"))
    sm = aws.sagemaker
    assert not exists(sm.describe_endpoint, EndpointName="broken")
    assert sm.list_models()["Models"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []


def test_running_out_of_patience_reports_and_leaves_the_endpoint_to_sagemaker(run, aws, scripted):
    scripted.statuses["slow"] = [("Creating", None)] * 3
    with pytest.raises(WaitTimeout, match="still Creating after 0 s"):
        run.deploy(sme("slow"), timeout_s=0)
    scripted.statuses.clear()
    assert aws.sagemaker.describe_endpoint(EndpointName="slow")["EndpointStatus"] == "InService"  # not rolled back


def test_update_in_place_swaps_config_and_model_and_deletes_the_old_ones(run, aws, calls, scripted):
    first = run.deploy(sme("live", autoscaling=AutoScaling(1, 3)))
    second = run.deploy(sme("live", environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}, autoscaling=AutoScaling(1, 4)))

    assert second.updated
    assert scripted.updates == [("live", second.config_name)]
    assert calls.of("UpdateEndpoint") == [{"EndpointName": "live", "EndpointConfigName": second.config_name}]
    sm = aws.sagemaker
    assert sm.describe_endpoint(EndpointName="live")["EndpointConfigName"] == second.config_name
    assert not exists(sm.describe_endpoint_config, EndpointConfigName=first.config_name)
    assert not exists(sm.describe_model, ModelName=first.model_name)
    assert set(second.removed) == {f"endpoint-config/{first.config_name}", f"model/{first.model_name}"}
    env = sm.describe_model(ModelName=second.model_name)["PrimaryContainer"]["Environment"]
    assert env == {"SAGEMAKER_TRITON_LOG_INFO": "false"}
    # Same instance type: the scaling registration stays and gets the new limits (the instance count an
    # auto-scaled endpoint keeps needs an endpoint scaled out, which moto cannot make: test_deploy_stubbed.py).
    assert "DeregisterScalableTarget" not in calls.names()
    (target,) = aws.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert target["MaxCapacity"] == 4

    third = run.deploy(sme("live", instance_type="ml.g4dn.2xlarge", autoscaling=AutoScaling(1, 4)))
    names = calls.names()
    # A new instance type: Application Auto Scaling needs the target deregistered before UpdateEndpoint.
    assert names.index("DeregisterScalableTarget") < len(names) - 1 - names[::-1].index("UpdateEndpoint")
    assert aws.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert sm.describe_endpoint(EndpointName="live")["EndpointConfigName"] == third.config_name


def test_a_failed_update_keeps_the_previous_config_serving_and_deletes_the_new_one(run, aws, scripted):
    first = run.deploy(sme("steady"))
    scripted.fail_update = "The new model failed its health check"
    with pytest.raises(DeployError, match="previous configuration still serves: The new model failed"):
        run.deploy(sme("steady", model_data="s3://models/demo/broken.tar.gz"))
    sm = aws.sagemaker
    assert sm.describe_endpoint(EndpointName="steady")["EndpointConfigName"] == first.config_name
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == [first.model_name]
    assert [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]] == [first.config_name]


def test_delete_removes_scaling_endpoint_config_models_and_leftovers_only_of_this_endpoint(run, aws):
    result = run.deploy(sme("gone", autoscaling=AutoScaling(1, 2)))
    sm = aws.sagemaker
    container = {"Image": IMAGE, "ModelDataUrl": "s3://models/x.tar.gz"}
    leftover = "gone-20260101000000-abcd"  # a tagged model a crashed run left behind
    sm.create_model(ModelName=leftover, ExecutionRoleArn=ROLE, PrimaryContainer=container,
                    Tags=[{"Key": MANAGED_TAG, "Value": "gone"}])  # fmt: skip
    sm.create_model(ModelName="gone-manual", ExecutionRoleArn=ROLE, PrimaryContainer=container)

    removed = run.delete("gone")

    assert removed == [
        "scalable-target/endpoint/gone/variant/AllTraffic",
        "endpoint/gone",
        f"endpoint-config/{result.config_name}",
        f"model/{result.model_name}",
        f"model/{leftover}",
    ]
    assert "endpoint gone: deleted" in run.messages
    assert not exists(sm.describe_endpoint, EndpointName="gone")
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["gone-manual"]  # not ours: kept
    assert aws.autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert run.delete("gone") == []


def test_endpoints_smtriton_did_not_create_are_left_alone_unless_forced(run, aws):
    sm = aws.sagemaker
    sm.create_model(ModelName="theirs", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": IMAGE})
    sm.create_endpoint_config(
        EndpointConfigName="theirs",
        ProductionVariants=[
            {"VariantName": "v", "ModelName": "theirs", "InstanceType": GPU, "InitialInstanceCount": 1}
        ],
    )
    sm.create_endpoint(EndpointName="theirs", EndpointConfigName="theirs")
    with pytest.raises(DeployError, match="not created by smtriton"):
        run.deploy(sme("theirs"))
    with pytest.raises(DeployError, match="not created by smtriton"):
        run.delete("theirs")
    assert sm.list_models()["Models"][0]["ModelName"] == "theirs"  # the refused deploy created nothing
    assert len(sm.list_models()["Models"]) == 1
    assert run.delete("theirs", force=True) == ["endpoint/theirs", "endpoint-config/theirs", "model/theirs"]


def test_serverless_and_async_configs_reach_sagemaker(run, aws, calls):
    serverless = run.deploy(sme("sls", instance_type=None, serverless=Serverless(memory_mb=3072, max_concurrency=8)))
    variant = aws.sagemaker.describe_endpoint_config(EndpointConfigName=serverless.config_name)["ProductionVariants"][0]
    assert variant["ServerlessConfig"] == {"MemorySizeInMB": 3072, "MaxConcurrency": 8}
    assert "InstanceType" not in calls.of("CreateEndpointConfig")[0]["ProductionVariants"][0]

    spec = sme(
        "queue", instance_type="ml.m5.xlarge", async_inference=AsyncInference("s3://out/", max_concurrent_invocations=2)
    )
    result = run.deploy(spec)
    stored = aws.sagemaker.describe_endpoint_config(EndpointConfigName=result.config_name)["AsyncInferenceConfig"]
    assert stored == {
        "OutputConfig": {"S3OutputPath": "s3://out/"},
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 2},
    }
    env = aws.sagemaker.describe_model(ModelName=result.model_name)["PrimaryContainer"]["Environment"]
    assert env["SMTRITON_REQUEST_TIMEOUT_S"] == "3600"


def test_the_deploy_and_delete_commands_over_boto3s_endpoint_setting(moto_url, session):
    from typer.testing import CliRunner

    from smtriton.cli import app

    env = {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }
    args = ["deploy", "cli-demo", "--image", IMAGE, "--role", ROLE, "--model-data", "s3://models/m.tar.gz",
            "--instance-type", GPU, "--env", "SAGEMAKER_TRITON_LOG_INFO=false", "--autoscale-max", "2",
            "--poll", "0.01"]  # fmt: skip
    created = CliRunner().invoke(app, args, env=env)
    assert created.exit_code == 0, created.output
    assert created.stdout.strip().splitlines()[-1] == "cli-demo"
    sm = session.client("sagemaker", endpoint_url=moto_url)
    assert sm.describe_endpoint(EndpointName="cli-demo")["EndpointStatus"] == "InService"

    bad = CliRunner().invoke(app, [*args[:-2], "--env", "SAGEMAKER_TRITON_LOG_VERBOSE=loud"], env=env)
    assert bad.exit_code == 1
    assert "SAGEMAKER_TRITON_LOG_VERBOSE" in bad.output

    deleted = CliRunner().invoke(app, ["delete-endpoint", "cli-demo", "--poll", "0.01"], env=env)
    assert deleted.exit_code == 0, deleted.output
    assert "endpoint/cli-demo" in deleted.stdout.splitlines()
    assert sm.list_models()["Models"] == []


def test_a_transform_job_and_its_model_through_moto(aws, calls):
    """moto implements transform jobs (they complete at once): the job is created as asked, followed to
    its end, and its model deleted."""
    from smtriton.aws.transform import TransformSpec, run_transform

    data = "s3://models/demo/model.tar.gz"
    spec = TransformSpec(name="nightly", image=IMAGE, role_arn=ROLE, model_data=data, input="s3://in/requests/",
                         output="s3://out/", split_type="Line", instance_type=GPU)  # fmt: skip
    messages: list[str] = []
    result = run_transform(aws.sagemaker, spec, wait=True, progress=messages.append, poll_s=0.01)
    assert result.status == "Completed"
    (job,) = calls.of("CreateTransformJob")
    assert job["TransformResources"]["TransformAmiVersion"] == "al2-ami-sagemaker-batch-gpu-535"
    assert job["TransformInput"]["SplitType"] == "Line"
    described = aws.sagemaker.describe_transform_job(TransformJobName="nightly")
    assert described["TransformJobStatus"] == "Completed"
    assert described["ModelName"] == result.model_name
    assert aws.sagemaker.list_models()["Models"] == []  # the job has ended: its model is gone
    assert "transform job nightly: Completed" in messages


def test_data_capture_and_the_deployment_options_through_the_command(moto_url, session):
    from typer.testing import CliRunner

    from smtriton.cli import app

    env = {"AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": REGION}  # fmt: skip
    args = ["deploy", "captured", "--image", IMAGE, "--role", ROLE, "--model-data", "s3://models/m.tar.gz",
            "--instance-type", GPU, "--data-capture", "s3://capture/demo/", "--capture-percent", "25",
            "--subnet", "subnet-0123456789abcdef0", "--security-group", "sg-0123456789abcdef0",
            "--network-isolation", "--kms-key", "alias/ml", "--volume-size", "64", "--model-download-timeout", "900",
            "--poll", "0.01"]  # fmt: skip
    created = CliRunner().invoke(app, args, env=env)
    assert created.exit_code == 0, created.output
    sm = session.client("sagemaker", endpoint_url=moto_url)
    config_name = sm.describe_endpoint(EndpointName="captured")["EndpointConfigName"]
    config = sm.describe_endpoint_config(EndpointConfigName=config_name)
    assert config["DataCaptureConfig"]["DestinationS3Uri"] == "s3://capture/demo/"
    assert config["DataCaptureConfig"]["InitialSamplingPercentage"] == 25
    assert config["KmsKeyId"] == "alias/ml"
    model = sm.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])
    assert model["VpcConfig"]["Subnets"] == ["subnet-0123456789abcdef0"]  # (moto keeps no EnableNetworkIsolation)
    refused = CliRunner().invoke(app, [*args[:-2], "--capture-percent", "150", "--poll", "0.01"], env=env)
    assert refused.exit_code == 1
    assert refused.output.strip().splitlines()[-1] == "error: the capture percentage must be 0-100"
