"""Inference components against botocore's Stubber (moto has no inference components): `deploy
--inference-component` makes the endpoint when it is missing and the component on it, updates a
component in place, rolls a failed one back; `delete-endpoint` removes components first; `invoke`
names the component. Every request is checked against botocore's service model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from smtriton.aws.deploy import (
    MANAGED_TAG,
    AutoScaling,
    Aws,
    Component,
    DeployError,
    EndpointSpec,
    delete_endpoint,
    deploy,
)
from smtriton.aws.invoke import encode_request, invoke
from tests.unit.aws_stubs import ANY, Clients, arn, endpoint, endpoint_config, model, streaming, vpc_hosting
from tests.unit.aws_stubs import T0 as CREATED

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/smtriton:1"
ROLE = "arn:aws:iam::123456789012:role/sagemaker"
DATA = "s3://models/encoder/model.tar.gz"
GPU = "ml.g5.12xlarge"
CONFIG = "shared-new"
MODEL = "encoder-new"
VPC = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]}
TAGS = [{"Key": MANAGED_TAG, "Value": "shared"}]


def spec(**kw: Any) -> EndpointSpec:
    fields: dict[str, Any] = {
        "image": IMAGE,
        "role_arn": ROLE,
        "model_data": DATA,
        "instance_type": GPU,
        "default_model": "encoder",
        "inference_component": Component("encoder", copies=2, accelerators=1, memory_mb=8192, cpu_cores=2),
        "startup_timeout_s": 900,
        "hosting": vpc_hosting(),
    }
    return EndpointSpec(name="shared", **(fields | kw))


class Run:
    def __init__(self, clients: Clients) -> None:
        self.aws = Aws(clients.sagemaker, clients.autoscaling, clients.cloudwatch, clients.s3, clients.ecr)
        self.messages: list[str] = []
        self.sleeps: list[float] = []

    def kw(self) -> dict[str, Any]:
        return {
            "progress": self.messages.append,
            "poll_s": 1.0,
            "sleep": self.sleeps.append,
            "clock": lambda: sum(self.sleeps),
        }


@pytest.fixture
def clients(monkeypatch):
    monkeypatch.setattr("smtriton.aws.deploy.resource_name", lambda base: f"{base}-new")
    monkeypatch.setattr("smtriton.aws.components.resource_name", lambda base: f"{base}-new")
    with Clients() as stubbed:
        yield stubbed


def component(status: str, model_name: str = MODEL, reason: str | None = None) -> dict[str, Any]:
    described = {
        "InferenceComponentName": "encoder",
        "InferenceComponentArn": arn("inference-component", "encoder"),
        "EndpointName": "shared",
        "EndpointArn": arn("endpoint", "shared"),
        "VariantName": "AllTraffic",
        "Specification": {"ModelName": model_name},
        "InferenceComponentStatus": status,
        "CreationTime": CREATED,
        "LastModifiedTime": CREATED,
    }
    if reason:
        described["FailureReason"] = reason
    return described


SPECIFICATION = {
    "ModelName": MODEL,
    "ComputeResourceRequirements": {
        "MinMemoryRequiredInMb": 8192,
        "NumberOfCpuCoresRequired": 2.0,
        "NumberOfAcceleratorDevicesRequired": 1.0,
    },
    "StartupParameters": {
        "ModelDataDownloadTimeoutInSeconds": 1200,
        "ContainerStartupHealthCheckTimeoutInSeconds": 900,
    },
}


def made_model(c: Clients) -> None:
    c.answer(
        "sagemaker",
        "create_model",
        {"ModelArn": arn("model", MODEL)},
        ModelName=MODEL,
        ExecutionRoleArn=ROLE,
        PrimaryContainer={
            "Image": IMAGE,
            "Mode": "SingleModel",
            "ModelDataUrl": DATA,
            "Environment": {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "encoder"},
        },
        VpcConfig=VPC,
        EnableNetworkIsolation=True,
        Tags=TAGS,
    )


def fresh_endpoint(c: Clients, statuses: tuple[str, ...] = ("Creating", "InService")) -> None:
    c.fail("sagemaker", "describe_endpoint", "ValidationException", 'Could not find endpoint "shared".')
    variant = {
        "VariantName": "AllTraffic",
        "InstanceType": GPU,
        "InitialInstanceCount": 1,
        "InitialVariantWeight": 1.0,
        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
        "VolumeSizeInGB": 100,
        "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4},
    }
    c.answer(
        "sagemaker",
        "create_endpoint_config",
        {"EndpointConfigArn": arn("endpoint-config", CONFIG)},
        EndpointConfigName=CONFIG,
        ProductionVariants=[variant],
        ExecutionRoleArn=ROLE,
        VpcConfig=VPC,
        EnableNetworkIsolation=True,
        KmsKeyId="alias/ml",
        Tags=TAGS,
    )
    c.answer(
        "sagemaker",
        "create_endpoint",
        {"EndpointArn": arn("endpoint", "shared")},
        EndpointName="shared",
        EndpointConfigName=CONFIG,
        Tags=TAGS,
    )
    for status in statuses:
        c.answer("sagemaker", "describe_endpoint", endpoint("shared", status, CONFIG))


def test_a_component_on_a_new_endpoint_made_for_components(clients):
    fresh_endpoint(clients)
    clients.fail(
        "sagemaker", "describe_inference_component", "ValidationException", "Could not find inference component"
    )
    made_model(clients)
    clients.answer(
        "sagemaker",
        "create_inference_component",
        {"InferenceComponentArn": arn("inference-component", "encoder")},
        InferenceComponentName="encoder",
        EndpointName="shared",
        VariantName="AllTraffic",
        Specification=SPECIFICATION,
        RuntimeConfig={"CopyCount": 2},
        Tags=TAGS,
    )
    clients.answer("sagemaker", "describe_inference_component", component("Creating"))
    clients.answer("sagemaker", "describe_inference_component", component("InService"))
    run = Run(clients)
    result = deploy(run.aws, spec(autoscaling=AutoScaling(0, 4)), **run.kw())
    assert (result.component, result.model_name, result.updated) == ("encoder", MODEL, False)
    assert "inference component encoder: InService" in run.messages


def test_a_second_deploy_updates_the_component_and_deletes_the_model_it_ran(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", "cfg"))
    clients.answer(
        "sagemaker",
        "describe_endpoint_config",
        endpoint_config("cfg", "x", InstanceType=GPU)
        | {"ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": GPU}]},
    )
    clients.answer("sagemaker", "describe_inference_component", component("InService", "encoder-old"))
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("inference-component", "encoder"))
    made_model(clients)
    clients.answer(
        "sagemaker",
        "update_inference_component",
        {"InferenceComponentArn": arn("inference-component", "encoder")},
        InferenceComponentName="encoder",
        Specification=SPECIFICATION,
        RuntimeConfig={"CopyCount": 2},
    )
    clients.answer("sagemaker", "describe_inference_component", component("Updating", "encoder-old"))
    clients.answer("sagemaker", "describe_inference_component", component("InService"))
    clients.answer("sagemaker", "describe_model", model("encoder-old", {"Image": IMAGE}, ROLE), ModelName="encoder-old")
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("model", "encoder-old"))
    clients.answer("sagemaker", "delete_model", {}, ModelName="encoder-old")
    run = Run(clients)
    result = deploy(run.aws, spec(), **run.kw())
    assert result.updated
    assert "updating inference component encoder: model encoder-old -> encoder-new" in run.messages


def test_a_component_that_fails_on_a_new_endpoint_is_rolled_back_with_it(clients):
    fresh_endpoint(clients)
    clients.fail(
        "sagemaker", "describe_inference_component", "ValidationException", "Could not find inference component"
    )
    made_model(clients)
    clients.answer(
        "sagemaker", "create_inference_component", {"InferenceComponentArn": arn("inference-component", "encoder")}
    )
    clients.answer("sagemaker", "describe_inference_component", component("Failed", reason="CUDA out of memory"))
    clients.answer("sagemaker", "delete_inference_component", {}, InferenceComponentName="encoder")
    clients.fail(
        "sagemaker", "describe_inference_component", "ValidationException", "Could not find inference component"
    )
    clients.answer("sagemaker", "describe_model", model(MODEL, {"Image": IMAGE}, ROLE))
    clients.answer("sagemaker", "delete_model", {}, ModelName=MODEL)
    clients.answer("sagemaker", "delete_endpoint", {}, EndpointName="shared")
    clients.fail("sagemaker", "describe_endpoint", "ValidationException", 'Could not find endpoint "shared".')
    clients.answer("sagemaker", "delete_endpoint_config", {}, EndpointConfigName=CONFIG)
    run = Run(clients)
    with pytest.raises(DeployError, match="inference component encoder is Failed: CUDA out of memory"):
        deploy(run.aws, spec(autoscaling=AutoScaling(0, 4)), **run.kw())


def test_an_endpoint_that_serves_a_model_takes_no_component(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", "cfg"))
    clients.answer("sagemaker", "describe_endpoint_config", endpoint_config("cfg", "its-model", InstanceType=GPU))
    run = Run(clients)
    with pytest.raises(DeployError, match="serves a model itself; inference components need an endpoint made for them"):
        deploy(run.aws, spec(), **run.kw())


def listed(c: Clients, names: list[str]) -> None:
    summaries = [
        {
            "InferenceComponentName": n,
            "InferenceComponentArn": arn("inference-component", n),
            "EndpointName": "shared",
            "EndpointArn": arn("endpoint", "shared"),
            "VariantName": "AllTraffic",
            "CreationTime": CREATED,
            "LastModifiedTime": CREATED,
        }
        for n in names
    ]
    c.answer("sagemaker", "list_inference_components", {"InferenceComponents": summaries}, EndpointNameEquals="shared")


def component_deleted(c: Clients) -> None:
    c.answer("sagemaker", "delete_inference_component", {}, InferenceComponentName="encoder")
    c.fail("sagemaker", "describe_inference_component", "ValidationException", "Could not find inference component")
    c.answer("sagemaker", "describe_model", model(MODEL, {"Image": IMAGE}, ROLE), ModelName=MODEL)
    c.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("model", MODEL))
    c.answer("sagemaker", "delete_model", {}, ModelName=MODEL)


def test_delete_endpoint_removes_its_components_first(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", CONFIG))
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("endpoint", "shared"))
    clients.answer(
        "sagemaker",
        "describe_endpoint_config",
        {**endpoint_config(CONFIG, "x"), "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": GPU}]},
    )
    listed(clients, ["encoder"])
    clients.answer("sagemaker", "describe_inference_component", component("InService"))
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("inference-component", "encoder"))
    component_deleted(clients)
    clients.answer("autoscaling", "describe_scalable_targets", {"ScalableTargets": []})
    clients.answer("sagemaker", "delete_endpoint", {}, EndpointName="shared")
    clients.fail("sagemaker", "describe_endpoint", "ValidationException", 'Could not find endpoint "shared".')
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("endpoint-config", CONFIG))
    clients.answer("sagemaker", "delete_endpoint_config", {}, EndpointConfigName=CONFIG)
    clients.answer("sagemaker", "list_endpoint_configs", {"EndpointConfigs": []})
    clients.answer("sagemaker", "list_models", {"Models": []})
    run = Run(clients)
    removed = delete_endpoint(run.aws, "shared", **run.kw())
    assert removed == ["inference-component/encoder", f"model/{MODEL}", "endpoint/shared", f"endpoint-config/{CONFIG}"]


def test_one_component_is_deleted_and_the_endpoint_stays(clients):
    listed(clients, ["encoder", "other"])
    clients.answer("sagemaker", "describe_inference_component", component("InService"))
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS}, ResourceArn=arn("inference-component", "encoder"))
    component_deleted(clients)
    run = Run(clients)
    assert delete_endpoint(run.aws, "shared", component="encoder", **run.kw()) == [
        "inference-component/encoder",
        f"model/{MODEL}",
    ]


def test_components_smtriton_did_not_make_stop_a_delete(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", CONFIG))
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS})
    clients.answer(
        "sagemaker",
        "describe_endpoint_config",
        {**endpoint_config(CONFIG, "x"), "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": GPU}]},
    )
    listed(clients, ["theirs"])
    clients.answer(
        "sagemaker", "describe_inference_component", component("InService") | {"InferenceComponentName": "theirs"}
    )
    clients.answer("sagemaker", "list_tags", {"Tags": []})
    run = Run(clients)
    with pytest.raises(DeployError, match=r"hosts inference components smtriton did not make \(theirs\)"):
        delete_endpoint(run.aws, "shared", **run.kw())


def test_invoke_names_the_component(clients):
    a = np.arange(4, dtype=np.int32).reshape(1, 4)
    response, content_type = encode_request({"OUTPUT0": a}, binary=False)
    body = response.replace(b'"inputs"', b'"model_name": "encoder", "outputs"')
    clients.answer(
        "runtime",
        "invoke_endpoint",
        {"Body": streaming(body), "ContentType": content_type},
        EndpointName="shared",
        Body=ANY,
        ContentType=ANY,
        InferenceComponentName="encoder",
    )
    result = invoke(clients.runtime, "shared", {"INPUT0": a}, component="encoder")
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], a)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"multi_model": True, "model_data": "s3://b/models/", "default_model": None}, "a multi-model endpoint"),
        ({"autoscaling": AutoScaling(1, 4, target=50)}, "takes no --autoscale-target"),
        ({"inference_component": Component("encoder", copies=0)}, "at least 1 copy"),
        ({"inference_component": Component("encoder", memory_mb=64)}, "128 MB"),
        ({"inference_component": Component("encoder", cpu_cores=0.1)}, "0.25 CPU cores"),
        ({"inference_component": Component("bad_name")}, "inference component name"),
    ],
)
def test_components_refused_before_any_call(change, message):
    from smtriton.aws.deploy import validate

    with pytest.raises(DeployError, match=message):
        validate(spec(**change))


def test_an_update_sagemaker_rolls_back_leaves_the_previous_model_and_deletes_the_new_one(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", "cfg"))
    clients.answer(
        "sagemaker",
        "describe_endpoint_config",
        {**endpoint_config("cfg", "x"), "ProductionVariants": [{"VariantName": "AllTraffic", "InstanceType": GPU}]},
    )
    clients.answer("sagemaker", "describe_inference_component", component("InService", "encoder-old"))
    clients.answer("sagemaker", "list_tags", {"Tags": TAGS})
    made_model(clients)
    clients.answer(
        "sagemaker", "update_inference_component", {"InferenceComponentArn": arn("inference-component", "encoder")}
    )
    clients.answer("sagemaker", "describe_inference_component", component("Updating", "encoder-old"))
    rolled_back = component("InService", "encoder-old", reason="the new copies failed their health check")
    clients.answer("sagemaker", "describe_inference_component", rolled_back)
    clients.answer("sagemaker", "delete_model", {}, ModelName=MODEL)
    run = Run(clients)
    with pytest.raises(DeployError, match="previous model still serves: the new copies failed their health check"):
        deploy(run.aws, spec(), **run.kw())


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        ({"instance_count": 2}, r"--instance-count 2 \(it started 1 instances\) would change it; leave it out"),
        (
            {"ami_version": "al2-ami-sagemaker-inference-gpu-3-1"},
            r"--inference-ami-version al2-ami-sagemaker-inference-gpu-3-1 \(it runs "
            r"al2023-ami-sagemaker-inference-gpu-4-1\)",
        ),
        ({"autoscaling": AutoScaling(1, 8)}, r"--autoscale-min 1 --autoscale-max 8 \(it scales 0-4 instances\)"),
        (
            {"instance_count": 3, "autoscaling": AutoScaling(0, 2)},
            r"--instance-count 3 \(it started 1 instances\), --autoscale-min 0 --autoscale-max 2 \(it scales 0-4 "
            r"instances\) would change it; leave them out, or delete the endpoint and deploy again$",
        ),
    ],
)
def test_a_component_added_to_an_existing_endpoint_refuses_endpoint_options_it_would_drop(clients, asked, named):
    """The endpoint stays as it is: --instance-count, --inference-ami-version and --autoscale-min/max that
    differ from what it runs are refused in one line naming them, before anything is made."""
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", "cfg"))
    variant = {
        "VariantName": "AllTraffic",
        "InstanceType": GPU,
        "InitialInstanceCount": 1,
        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
        "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4},
    }
    clients.answer(
        "sagemaker", "describe_endpoint_config", endpoint_config("cfg", "x") | {"ProductionVariants": [variant]}
    )
    run = Run(clients)
    with pytest.raises(DeployError, match=r"^endpoint shared exists, and an inference component added to it leaves "
                       r"it as it is: " + named):  # fmt: skip
        deploy(run.aws, spec(**asked), **run.kw())


def test_a_component_added_to_an_existing_endpoint_takes_the_endpoint_options_it_already_runs(clients):
    clients.answer("sagemaker", "describe_endpoint", endpoint("shared", "InService", "cfg"))
    variant = {
        "VariantName": "AllTraffic",
        "InstanceType": GPU,
        "InitialInstanceCount": 1,
        "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4},
    }
    clients.answer(
        "sagemaker", "describe_endpoint_config", endpoint_config("cfg", "x") | {"ProductionVariants": [variant]}
    )
    clients.fail(
        "sagemaker", "describe_inference_component", "ValidationException", "Could not find inference component"
    )
    made_model(clients)
    clients.answer(
        "sagemaker", "create_inference_component", {"InferenceComponentArn": arn("inference-component", "encoder")}
    )
    clients.answer("sagemaker", "describe_inference_component", component("InService"))
    run = Run(clients)
    result = deploy(run.aws, spec(instance_count=1, autoscaling=AutoScaling(0, 4)), **run.kw())
    assert (result.component, result.updated) == ("encoder", False)
