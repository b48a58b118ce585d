"""Deployment requests built from a spec, and the specs refused or warned about before any AWS call."""

from __future__ import annotations

import re

import pytest

from smtriton.aws.deploy import (
    MANAGED_TAG,
    NAME_RE,
    AsyncInference,
    AutoScaling,
    Component,
    DataCapture,
    DeployError,
    EndpointSpec,
    Hosting,
    Serverless,
    endpoint_config_request,
    is_gpu_instance,
    model_request,
    resource_name,
    validate,
)
from smtriton.aws.docker_image import sagemaker_triton_image
from smtriton.aws.scaling import policy_requests, target_request
from smtriton.serve.settings import known_variables
from tests.unit.aws_stubs import valid, vpc_hosting

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/smtriton:1"
ROLE = "arn:aws:iam::123456789012:role/sagemaker"


def sme(**kw) -> EndpointSpec:
    base = dict(
        name="demo", image=IMAGE, role_arn=ROLE, model_data="s3://b/m/model.tar.gz", instance_type="ml.g5.xlarge"
    )
    return EndpointSpec(**(base | kw))


def mme(**kw) -> EndpointSpec:
    return sme(**({"multi_model": True, "model_data": "s3://b/models"} | kw))


def test_sme_model_request_carries_image_mode_data_env_role_and_the_managed_tag():
    spec = sme(default_model="resnet", environment={"SAGEMAKER_TRITON_LOG_INFO": "false"}, tags={"team": "ml"})
    assert validate(spec) == []
    assert model_request(spec, "demo-m") == {
        "ModelName": "demo-m",
        "ExecutionRoleArn": ROLE,
        "PrimaryContainer": {
            "Image": IMAGE,
            "Mode": "SingleModel",
            "ModelDataUrl": "s3://b/m/model.tar.gz",
            "Environment": {"SAGEMAKER_TRITON_LOG_INFO": "false", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "resnet"},
        },
        "Tags": [{"Key": MANAGED_TAG, "Value": "demo"}, {"Key": "team", "Value": "ml"}],
    }


def test_sme_from_an_uncompressed_s3_prefix_uses_model_data_source():
    container = model_request(sme(model_data="s3://b/repo/"), "m")["PrimaryContainer"]
    assert "ModelDataUrl" not in container
    assert container["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": "s3://b/repo/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }


def test_mme_model_request_is_multi_model_on_a_prefix_with_the_mme_switch():
    container = model_request(mme(), "m")["PrimaryContainer"]
    assert container["Mode"] == "MultiModel"
    assert container["ModelDataUrl"] == "s3://b/models/"
    assert container["Environment"] == {"SAGEMAKER_MULTI_MODEL": "true"}


def test_real_time_endpoint_config_has_one_variant_with_instances_and_startup_timeout():
    request = endpoint_config_request(sme(instance_count=2, startup_timeout_s=900), "demo-c", "demo-m")
    assert request == {
        "EndpointConfigName": "demo-c",
        "ProductionVariants": [
            {
                "VariantName": "AllTraffic",
                "ModelName": "demo-m",
                "InstanceType": "ml.g5.xlarge",
                "InitialInstanceCount": 2,
                "InitialVariantWeight": 1.0,
                # a GPU type runs the AMI with the newest NVIDIA driver, which runs any image's CUDA
                "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
                "ContainerStartupHealthCheckTimeoutInSeconds": 900,
            }
        ],
        "Tags": [{"Key": MANAGED_TAG, "Value": "demo"}],
    }


def test_serverless_config_has_no_instances():
    spec = sme(instance_type=None, serverless=Serverless(memory_mb=2048, max_concurrency=5, provisioned_concurrency=1))
    warnings = validate(spec)
    assert any("cpu" in w and "10 GB" in w for w in warnings)
    variant = endpoint_config_request(spec, "c", "m")["ProductionVariants"][0]
    assert variant == {
        "VariantName": "AllTraffic",
        "ModelName": "m",
        "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 5, "ProvisionedConcurrency": 1},
    }


def test_async_config_and_the_longer_container_limits_it_implies():
    spec = sme(
        instance_type="ml.m5.xlarge",
        async_inference=AsyncInference(
            "s3://b/out/", "s3://b/fail/", success_topic="arn:aws:sns:us-east-1:1:ok", max_concurrent_invocations=4
        ),
    )
    assert validate(spec) == []
    assert endpoint_config_request(spec, "c", "m")["AsyncInferenceConfig"] == {
        "OutputConfig": {
            "S3OutputPath": "s3://b/out/",
            "S3FailurePath": "s3://b/fail/",
            "NotificationConfig": {"SuccessTopic": "arn:aws:sns:us-east-1:1:ok"},
        },
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
    }
    env = spec.model().container_environment()
    assert env["SMTRITON_REQUEST_TIMEOUT_S"] == "3600"
    assert env["SMTRITON_MAX_PAYLOAD_BYTES"] == str(1024**3)
    assert (
        sme(async_inference=AsyncInference("s3://b/o/"), environment={"SMTRITON_REQUEST_TIMEOUT_S": "90"})
        .model()
        .container_environment()["SMTRITON_REQUEST_TIMEOUT_S"]
        == "90"
    )


def test_scaling_requests_track_invocations_per_instance():
    target = target_request("demo", AutoScaling(1, 4, 250.0, 600, 30))
    (policy,) = policy_requests("demo", AutoScaling(1, 4, 250.0, 600, 30), asynchronous=False)
    assert target == {
        "ServiceNamespace": "sagemaker",
        "ResourceId": "endpoint/demo/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 1,
        "MaxCapacity": 4,
    }
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert config["PredefinedMetricSpecification"] == {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}
    assert (config["TargetValue"], config["ScaleInCooldown"], config["ScaleOutCooldown"]) == (250.0, 600, 30)


def test_an_asynchronous_endpoint_tracks_its_queue_and_from_zero_wakes_on_its_backlog():
    (tracking,) = policy_requests("q", AutoScaling(1, 4), asynchronous=True)
    metric = tracking["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]
    assert (metric["MetricName"], metric["Dimensions"]) == (
        "ApproximateBacklogSizePerInstance",
        [{"Name": "EndpointName", "Value": "q"}],
    )
    tracking, wake = policy_requests("q", AutoScaling(0, 4), asynchronous=True)
    assert wake["PolicyType"] == "StepScaling"
    assert wake["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (sme(name="bad_name"), "endpoint name"),
        (sme(role_arn="sagemaker-role"), "IAM role ARN"),
        (mme(model_data="s3://b/models/model.tar.gz"), "S3 prefix"),
        (mme(model_data=None), "S3 prefix"),
        (mme(default_model="x"), "no default model"),
        (sme(model_data="/local/model.tar.gz"), "model data"),
        (sme(model_data="s3://b/model.zip"), "model data"),
        (sme(instance_type=None), "instance type"),
        (sme(instance_count=0), "instance count"),
        (sme(environment={"SAGEMAKER_TRITON_LOG_VERBOSE": "loud"}), "environment"),
        (sme(environment={"SMTRITON_MAX_CONCURRENT_LOADS": "0"}), "environment"),
        (mme(instance_type=None, serverless=Serverless()), "serverless"),
        (sme(instance_type=None, serverless=Serverless(memory_mb=1000)), "memory"),
        (sme(instance_type=None, serverless=Serverless(max_concurrency=500)), "concurrency"),
        (sme(instance_type=None, serverless=Serverless(), autoscaling=AutoScaling()), "auto-scaling"),
        (mme(async_inference=AsyncInference("s3://b/o/")), "asynchronous"),
        (sme(async_inference=AsyncInference("/tmp/out")), "s3://"),
        (sme(autoscaling=AutoScaling(min_capacity=0)), "min capacity"),
        (sme(autoscaling=AutoScaling(min_capacity=3, max_capacity=2)), "min capacity"),
        (sme(autoscaling=AutoScaling(), remove_autoscaling=True), "not both"),
        (sme(startup_timeout_s=30), "start-up"),
    ],
)
def test_invalid_specs_are_refused_before_any_aws_call(spec, message):
    with pytest.raises(DeployError, match=message):
        validate(spec)


def test_gpu_mme_warns_unless_built_on_sagemakers_triton_image():
    (warning,) = validate(mme())
    assert "GPU" in warning
    assert "base is unknown" in warning
    (warning,) = validate(mme(base_image="nvcr.io/nvidia/tritonserver:25.04-py3"))
    assert "nvcr.io/nvidia/tritonserver:25.04-py3" in warning
    assert "sagemaker-tritonserver" in warning
    assert validate(mme(base_image=sagemaker_triton_image("us-east-1"))) == []
    assert validate(mme(image=sagemaker_triton_image("us-east-1"))) == []
    assert validate(mme(instance_type="ml.c5.xlarge")) == []  # CPU MME: any base
    assert validate(sme()) == []  # GPU SME: any base


def test_unknown_serve_variables_are_warned_about():
    (warning,) = validate(sme(environment={"SAGEMAKER_TRITON_LOG_VERBOS": "1", "MY_APP_SETTING": "x"}))
    assert "SAGEMAKER_TRITON_LOG_VERBOS" in warning


def test_the_variables_serve_knows_are_those_of_its_settings_schema():
    known = known_variables()
    assert {"SAGEMAKER_BIND_TO_PORT", "SAGEMAKER_TRITON_GRPC_PORT", "SMTRITON_LOG_FORMAT", "TRITONSERVER"} <= known
    assert validate(sme(environment=dict.fromkeys(known, ""))) == []


def test_variables_without_effect_are_warned_about():
    (warning,) = validate(sme(environment={"SAGEMAKER_TRITON_ALLOW_GRPC": "true"}))
    assert warning.startswith("SAGEMAKER_TRITON_ALLOW_GRPC has no effect")


def test_gpu_instances_and_resource_names():
    assert is_gpu_instance("ml.g5.xlarge")
    assert is_gpu_instance("ml.p4d.24xlarge")
    assert is_gpu_instance("ml.g6e.2xlarge")
    assert not is_gpu_instance("ml.m5.xlarge")
    assert not is_gpu_instance("ml.inf2.xlarge")
    assert not is_gpu_instance(None)
    name = resource_name("x" * 63)
    assert NAME_RE.match(name)
    assert len(name) <= 63
    assert re.fullmatch(r"demo-\d{14}-[0-9a-f]{4}", resource_name("demo"))
    assert resource_name("demo") != resource_name("demo")


VPC_HOSTING = vpc_hosting()


def test_the_deployment_options_go_where_the_api_takes_them():
    spec = sme(hosting=VPC_HOSTING, data_capture=DataCapture("s3://b/capture/", percent=20),
               async_inference=AsyncInference("s3://b/out/"))  # fmt: skip
    assert validate(spec) == []
    model = valid("sagemaker", "CreateModel", model_request(spec, "m"))
    assert model["VpcConfig"] == {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]}
    assert model["EnableNetworkIsolation"] is True
    config = valid("sagemaker", "CreateEndpointConfig", endpoint_config_request(spec, "c", "m"))
    (variant,) = config["ProductionVariants"]
    assert (variant["ModelDataDownloadTimeoutInSeconds"], variant["VolumeSizeInGB"]) == (1200, 100)
    assert config["KmsKeyId"] == "alias/ml"
    assert config["AsyncInferenceConfig"]["OutputConfig"]["KmsKeyId"] == "alias/ml"
    assert config["DataCaptureConfig"] == {
        "EnableCapture": True,
        "InitialSamplingPercentage": 20,
        "DestinationS3Uri": "s3://b/capture/",
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]},
        "KmsKeyId": "alias/ml",
    }
    plain = endpoint_config_request(sme(), "c", "m")
    assert not {"KmsKeyId", "DataCaptureConfig"} & set(plain)
    assert not {"VpcConfig", "EnableNetworkIsolation"} & set(model_request(sme(), "m"))


def test_an_endpoint_for_inference_components_carries_role_vpc_and_managed_scaling():
    spec = sme(inference_component=Component("enc", memory_mb=2048), hosting=VPC_HOSTING,
               autoscaling=AutoScaling(0, 3))  # fmt: skip
    assert validate(spec) == []
    config = valid("sagemaker", "CreateEndpointConfig", endpoint_config_request(spec, "c", None))
    (variant,) = config["ProductionVariants"]
    assert "ModelName" not in variant
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 3}
    assert "ModelDataDownloadTimeoutInSeconds" not in variant  # a component's own start-up parameter
    assert (config["ExecutionRoleArn"], config["EnableNetworkIsolation"]) == (ROLE, True)
    assert config["VpcConfig"]["Subnets"] == ["subnet-0123456789abcdef0"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (sme(instance_type=None, serverless=Serverless(), data_capture=DataCapture("s3://b/c/")), "do not capture"),
        (sme(instance_type=None, serverless=Serverless(), hosting=Hosting(network_isolation=True)), "serverless"),
        (sme(instance_type=None, serverless=Serverless(), hosting=Hosting(volume_size_gb=10)), "--volume-size"),
        (sme(data_capture=DataCapture("/tmp/capture")), "s3://"),
        (sme(data_capture=DataCapture("s3://b/c/", percent=101)), "0-100"),
        (sme(hosting=Hosting(model_download_timeout_s=30)), "60-3600"),
        (sme(hosting=Hosting(volume_size_gb=1000)), "1-512"),
        (sme(hosting=Hosting(subnets=("subnet-x",), security_groups=("sg-0123456789abcdef0",))), "subnet id"),
        (sme(hosting=Hosting(security_groups=("sg-0123456789abcdef0",))), "both --subnet and --security-group"),
        (sme(hosting=Hosting(kms_key="key with spaces")), "KMS key"),
    ],
)
def test_deployment_options_refused_before_any_call(spec, message):
    with pytest.raises(DeployError, match=message):
        validate(spec)


def test_an_inference_ami_version_is_asked_for_on_gpu_types_only():
    chosen = endpoint_config_request(sme(ami_version="al2-ami-sagemaker-inference-gpu-3-1"), "c", "m")
    assert chosen["ProductionVariants"][0]["InferenceAmiVersion"] == "al2-ami-sagemaker-inference-gpu-3-1"
    cpu = endpoint_config_request(sme(instance_type="ml.c5.xlarge"), "c", "m")
    assert "InferenceAmiVersion" not in cpu["ProductionVariants"][0]
    with pytest.raises(DeployError, match=r"an AMI version is for GPU instance types; ml\.c5\.xlarge has no GPU"):
        validate(sme(instance_type="ml.c5.xlarge", ami_version="al2-ami-sagemaker-inference-gpu-3-1"))
    with pytest.raises(DeployError):
        validate(sme(ami_version="al2-ami-sagemaker-inference-gpu-9"))  # not one SageMaker offers


# The families of SageMaker's instance types that carry no NVIDIA GPU: general purpose, compute,
# memory, burstable, AWS Inferentia and Trainium, Habana Gaudi. A family botocore lists that is neither
# this nor GPU_INSTANCE_RE's P or G fails the test below, so a new spelling is decided, not guessed.
NOT_GPU_FAMILY = re.compile(r"^(m|c|r|t|inf|trn|dl)\d+[a-z0-9-]*$")


def test_every_instance_type_in_botocores_enums_is_told_gpu_or_not():
    """Every P and G type of ProductionVariantInstanceType and TransformInstanceType is a GPU type —
    the Blackwell ml.p6-b200, ml.p6-b300 and ml.p6e-gb200 too — and every other family is one known to
    have no GPU."""
    botocore_session = pytest.importorskip("botocore.session")
    model = botocore_session.get_session().get_service_model("sagemaker")
    types = {
        t for shape in ("ProductionVariantInstanceType", "TransformInstanceType") for t in model.shape_for(shape).enum
    }
    gpu = {t for t in types if re.match(r"^ml\.[pg]\d", t)}
    unknown = sorted(t for t in types - gpu if not NOT_GPU_FAMILY.match(t.split(".")[1]))
    assert unknown == [], "instance families neither GPU nor known to have none"
    assert [t for t in sorted(gpu) if not is_gpu_instance(t)] == []
    assert [t for t in sorted(types - gpu) if is_gpu_instance(t)] == []
    blackwell = {"ml.p6-b200.48xlarge", "ml.p6e-gb200.36xlarge"} & types
    assert blackwell, "this botocore lists no Blackwell type: the check below proves nothing"
    for instance_type in blackwell:
        variant = endpoint_config_request(sme(instance_type=instance_type), "c", "m")["ProductionVariants"][0]
        assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"
        chosen = sme(instance_type=instance_type, ami_version="al2-ami-sagemaker-inference-gpu-3-1")
        assert validate(chosen) == []  # asked for on a GPU type: taken, not refused as "no GPU"


def test_a_botocore_without_the_ami_members_deploys_with_one_warning_and_refuses_an_asked_version(monkeypatch):
    """boto3 before 1.37.23 (TransformAmiVersion) or 1.34.122 (InferenceAmiVersion): a CPU deployment is
    not concerned, a GPU one runs SageMaker's default AMI and says so, an asked-for version is refused."""
    import copy

    import botocore.model
    import botocore.session

    from smtriton.aws import ami

    real = botocore.session.Session.get_service_model

    def without_ami_members(self, name, api_version=None):
        description = copy.deepcopy(real(self, name, api_version)._service_description)
        for structure, member in ami.MEMBERS.values():
            del description["shapes"][structure]["members"][member]
        return botocore.model.ServiceModel(description, name)

    monkeypatch.setattr(botocore.session.Session, "get_service_model", without_ami_members)
    ami.versions.cache_clear()
    ami.unknown_to_botocore.cache_clear()
    try:
        assert validate(sme(instance_type="ml.c5.xlarge")) == []
        cpu = endpoint_config_request(sme(instance_type="ml.c5.xlarge"), "c", "m")["ProductionVariants"][0]
        assert "InferenceAmiVersion" not in cpu
        (warning,) = validate(sme(instance_type="ml.g5.xlarge"))
        assert re.fullmatch(
            r"botocore \S+ predates InferenceAmiVersion \(boto3 1\.34\.122 or newer has it\): ml\.g5\.xlarge runs "
            r"SageMaker's default AMI, whose NVIDIA driver may be older than the image's CUDA",
            warning,
        )
        gpu = endpoint_config_request(sme(instance_type="ml.g5.xlarge"), "c", "m")["ProductionVariants"][0]
        assert "InferenceAmiVersion" not in gpu
        with pytest.raises(DeployError, match=r"^cannot ask for AMI version 'al2-ami-sagemaker-inference-gpu-3-1': "):
            validate(sme(ami_version="al2-ami-sagemaker-inference-gpu-3-1"))
    finally:
        ami.versions.cache_clear()
        ami.unknown_to_botocore.cache_clear()
