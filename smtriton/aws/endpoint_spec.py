"""What one endpoint is made of (:class:`EndpointSpec`), the checks before anything is made, and the
CreateModel and CreateEndpointConfig requests it becomes.

Pure: nothing here calls AWS, so a spec is refused (or warned about) before the first request is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smtriton.aws import ami
from smtriton.aws.ami import is_gpu_instance
from smtriton.aws.capture import DataCapture
from smtriton.aws.components import Component
from smtriton.aws.docker_image import is_sagemaker_triton_image
from smtriton.aws.hosting import Hosting
from smtriton.aws.model import ServingModel, is_s3
from smtriton.aws.resources import MANAGED_TAG, DeployError, check_name, tags
from smtriton.aws.scaling import VARIANT, AutoScaling

DATA_ETAG_TAG = "smtriton:model-data-etag"  # the model archive's S3 ETag when the model was made
SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)


@dataclass(frozen=True)
class Serverless:
    memory_mb: int = 4096
    max_concurrency: int = 10
    provisioned_concurrency: int | None = None


@dataclass(frozen=True)
class AsyncInference:
    output_path: str
    failure_path: str | None = None
    success_topic: str | None = None
    error_topic: str | None = None
    max_concurrent_invocations: int | None = None


@dataclass(frozen=True)
class EndpointSpec:
    """One endpoint. ``model_data``: SME a ``model.tar.gz`` or an S3 prefix (uncompressed), MME a prefix.
    With ``inference_component``, the endpoint hosts that component, which runs the image and model data."""

    name: str
    image: str
    role_arn: str
    model_data: str | None = None
    multi_model: bool = False
    instance_type: str | None = None
    instance_count: int | None = None  # None: 1 on a new endpoint; an existing one keeps its own
    environment: Mapping[str, str] = field(default_factory=dict)
    default_model: str | None = None
    serverless: Serverless | None = None
    async_inference: AsyncInference | None = None
    autoscaling: AutoScaling | None = None
    remove_autoscaling: bool = False  # an update deregisters the variant's auto-scaling
    startup_timeout_s: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    # What the image was built on (its org.opencontainers.image.base.name label), when known.
    base_image: str | None = None
    hosting: Hosting = field(default_factory=Hosting)
    data_capture: DataCapture | None = None
    inference_component: Component | None = None
    # InferenceAmiVersion on a GPU instance type: None picks the one with the newest NVIDIA driver (an
    # image's CUDA runs on a newer driver, never an older one); asking for one on a CPU type is refused.
    ami_version: str | None = None

    @property
    def count(self) -> int:
        """The instances a new endpoint (or variant) starts with."""
        return 1 if self.instance_count is None else self.instance_count

    def model(self) -> ServingModel:
        return ServingModel(
            self.image, self.role_arn, self.model_data, self.multi_model, self.environment, self.default_model,
            self.async_inference is not None, self.hosting,
        )  # fmt: skip


def validate(spec: EndpointSpec) -> list[str]:
    """Raise DeployError for a spec SageMaker (or Triton) cannot run; return warnings for dubious ones."""
    check_name(spec.name)
    warnings = spec.model().check()
    spec.hosting.check(serverless=spec.serverless is not None)
    if spec.data_capture is not None:
        spec.data_capture.check()
        if spec.serverless is not None:
            raise DeployError("serverless endpoints do not capture data")
    if spec.inference_component is not None:
        _check_component_endpoint(spec)
    if spec.serverless is not None:
        s = spec.serverless
        if spec.ami_version is not None:
            raise DeployError("serverless endpoints run no AMI of yours: --inference-ami-version is for GPU instances")
        if spec.multi_model:
            raise DeployError("serverless endpoints cannot be multi-model endpoints")
        if spec.async_inference is not None or spec.autoscaling is not None:
            raise DeployError("serverless endpoints take neither asynchronous inference nor an auto-scaling policy")
        if s.memory_mb not in SERVERLESS_MEMORY_MB:
            raise DeployError(f"serverless memory must be one of {SERVERLESS_MEMORY_MB} MB, not {s.memory_mb}")
        if not 1 <= s.max_concurrency <= 200:
            raise DeployError("serverless max concurrency must be 1-200")
        if s.provisioned_concurrency is not None and not 1 <= s.provisioned_concurrency <= s.max_concurrency:
            raise DeployError("serverless provisioned concurrency must be 1 to the max concurrency")
        warnings.append(
            "serverless endpoints run CPU only and take images up to 10 GB: deploy the `cpu` target, "
            "not an image on NVIDIA's Triton base"
        )
    else:
        if not spec.instance_type or not spec.instance_type.startswith("ml."):
            raise DeployError("an instance type (ml.*) is needed unless the endpoint is serverless")
        if spec.count < 1:
            raise DeployError("instance count must be at least 1")
        ami.choose("endpoint", spec.instance_type, spec.ami_version)  # refused before anything is made
        if (note := ami.warning("endpoint", spec.instance_type)) is not None:
            warnings.append(note)
    if spec.async_inference is not None:
        a = spec.async_inference
        if spec.multi_model:
            raise DeployError("asynchronous inference endpoints cannot be multi-model endpoints")
        for path in (a.output_path, a.failure_path):
            if path is not None and not is_s3(path):
                raise DeployError(f"asynchronous inference output {path!r} must be an s3:// location")
    if spec.autoscaling is not None:
        sc = spec.autoscaling
        floor = 0 if spec.async_inference is not None or spec.inference_component is not None else 1
        if sc.min_capacity < floor or sc.max_capacity < sc.min_capacity:
            raise DeployError(f"auto-scaling needs {floor} <= min capacity <= max capacity")
        if sc.target is not None and sc.target <= 0:
            raise DeployError("auto-scaling target must be a positive number (per instance)")
        if spec.remove_autoscaling:
            raise DeployError("auto-scaling is either attached or removed, not both")
    if spec.startup_timeout_s is not None and not 60 <= spec.startup_timeout_s <= 3600:
        raise DeployError("the container start-up health check timeout must be 60-3600 s")
    if spec.multi_model and is_gpu_instance(spec.instance_type):
        base = spec.base_image
        if is_sagemaker_triton_image(spec.image) or (base and is_sagemaker_triton_image(base)):
            pass
        elif base:
            warnings.append(
                f"GPU multi-model endpoint on an image built on {base}: AWS supports multi-model endpoints "
                "on GPU instances only with SageMaker's Triton image (build with "
                "--base-image <account>.dkr.ecr.<region>.amazonaws.com/sagemaker-tritonserver:<YY.MM>-py3)"
            )
        else:
            warnings.append(
                "GPU multi-model endpoint, and the image's base is unknown (not in the local docker store): "
                "AWS supports multi-model endpoints on GPU instances only with SageMaker's Triton image"
            )
    return warnings


def _check_component_endpoint(spec: EndpointSpec) -> None:
    """An inference component runs one model on an instance-based, real-time endpoint."""
    assert spec.inference_component is not None
    spec.inference_component.check()
    for refused, what in (
        (spec.multi_model, "a multi-model endpoint"), (spec.serverless, "a serverless endpoint"),
        (spec.async_inference, "asynchronous inference"), (spec.remove_autoscaling, "--remove-autoscaling"),
    ):  # fmt: skip
        if refused:
            raise DeployError(f"an inference component cannot run on {what}")
    if spec.autoscaling is not None and spec.autoscaling.target is not None:
        raise DeployError(
            "an endpoint of inference components scales its instances itself (managed instance scaling, "
            "--autoscale-min/--autoscale-max); it takes no --autoscale-target"
        )


def model_request(spec: EndpointSpec, model_name: str, data_etag: str | None = None) -> dict[str, Any]:
    """The endpoint's CreateModel request; ``data_etag`` (the archive's S3 ETag) is kept as a tag to
    compare with later."""
    extra = dict(spec.tags) | ({DATA_ETAG_TAG: data_etag} if data_etag else {})
    return spec.model().request(model_name, tags(MANAGED_TAG, spec.name, extra))


def endpoint_config_request(
    spec: EndpointSpec, config_name: str, model_name: str | None, instance_count: int | None = None
) -> dict[str, Any]:
    """The CreateEndpointConfig request (one variant, all traffic); ``instance_count`` overrides the spec's.
    Without ``model_name``, the configuration of an endpoint for inference components: no model in the
    variant, the execution role, VPC and isolation on the configuration, and managed instance scaling."""
    variant: dict[str, Any] = {"VariantName": VARIANT}
    if model_name is not None:
        variant["ModelName"] = model_name
    if spec.serverless is not None:
        serverless: dict[str, Any] = {
            "MemorySizeInMB": spec.serverless.memory_mb,
            "MaxConcurrency": spec.serverless.max_concurrency,
        }
        if spec.serverless.provisioned_concurrency is not None:
            serverless["ProvisionedConcurrency"] = spec.serverless.provisioned_concurrency
        variant["ServerlessConfig"] = serverless
    else:
        count = spec.count if instance_count is None else instance_count
        variant.update(InstanceType=spec.instance_type, InitialInstanceCount=count, InitialVariantWeight=1.0)
        ami_version = ami.choose("endpoint", spec.instance_type, spec.ami_version)
        if ami_version is not None:
            variant["InferenceAmiVersion"] = ami_version
        if model_name is None:  # a component starts its own containers: its startup limits are its own
            if spec.hosting.volume_size_gb is not None:
                variant["VolumeSizeInGB"] = spec.hosting.volume_size_gb
            if spec.autoscaling is not None:
                variant["ManagedInstanceScaling"] = {
                    "Status": "ENABLED",
                    "MinInstanceCount": spec.autoscaling.min_capacity,
                    "MaxInstanceCount": spec.autoscaling.max_capacity,
                }
        else:
            variant.update(spec.hosting.variant_fields())
            if spec.startup_timeout_s is not None:
                variant["ContainerStartupHealthCheckTimeoutInSeconds"] = spec.startup_timeout_s
    request: dict[str, Any] = {"EndpointConfigName": config_name, "ProductionVariants": [variant]}
    if model_name is None:
        request.update(ExecutionRoleArn=spec.role_arn, **spec.hosting.model_fields())
    if spec.hosting.kms_key:
        request["KmsKeyId"] = spec.hosting.kms_key
    if spec.data_capture is not None:
        request["DataCaptureConfig"] = spec.data_capture.request(spec.hosting.kms_key)
    if spec.async_inference is not None:
        a = spec.async_inference
        output: dict[str, Any] = {"S3OutputPath": a.output_path}
        if spec.hosting.kms_key:
            output["KmsKeyId"] = spec.hosting.kms_key
        if a.failure_path:
            output["S3FailurePath"] = a.failure_path
        notify = {k: v for k, v in (("SuccessTopic", a.success_topic), ("ErrorTopic", a.error_topic)) if v}
        if notify:
            output["NotificationConfig"] = notify
        config: dict[str, Any] = {"OutputConfig": output}
        if a.max_concurrent_invocations is not None:
            config["ClientConfig"] = {"MaxConcurrentInvocationsPerInstance": a.max_concurrent_invocations}
        request["AsyncInferenceConfig"] = config
    request["Tags"] = tags(MANAGED_TAG, spec.name, spec.tags)
    return request
