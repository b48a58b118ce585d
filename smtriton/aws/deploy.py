"""Deploy the serving image to SageMaker: single-model (SME) and multi-model (MME) endpoints.

One call creates — or updates in place — a model, an endpoint configuration and an endpoint, waits
while printing the status, and optionally attaches auto-scaling (:mod:`smtriton.aws.scaling`).
Everything it creates carries the tag ``smtriton:endpoint=<endpoint name>``, and :func:`delete_endpoint`
removes exactly what carries it, so nothing is left behind: a failed create is rolled back, and an
update deletes the configuration and model it replaced.

An update keeps what the endpoint has become since it was deployed: an auto-scaled variant keeps the
instances it runs now (on the same instance type) and its scaling registration, which is removed only
when asked and put back when SageMaker rolls the update back. An update that would change nothing
(same requests, the image tag still naming the digest that serves, the model archive's ETag the one
recorded at deploy time) is not made.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from smtriton.aws import ami, components, scaling
from smtriton.aws.ami import is_gpu_instance
from smtriton.aws.capture import DataCapture
from smtriton.aws.components import Component
from smtriton.aws.docker_image import is_sagemaker_triton_image
from smtriton.aws.hosting import Hosting
from smtriton.aws.model import ServingModel, is_s3
from smtriton.aws.resources import (
    MANAGED_TAG,
    NAME_RE,
    DeployError,
    WaitTimeout,
    check_name,
    described_or_none,
    error_code,
    error_text,
    is_access_denied,
    is_managed,
    is_not_found,
    name_prefix,
    resource_name,
    tags,
)
from smtriton.aws.scaling import VARIANT, AutoScaling
from smtriton.aws.waiting import Poller

__all__ = [
    "MANAGED_TAG",
    "NAME_RE",
    "AsyncInference",
    "AutoScaling",
    "Aws",
    "Component",
    "DataCapture",
    "DeployError",
    "DeployResult",
    "EndpointSpec",
    "Hosting",
    "Serverless",
    "WaitTimeout",
    "delete_endpoint",
    "deploy",
    "endpoint_config_request",
    "is_gpu_instance",
    "model_request",
    "resource_name",
    "validate",
]

Progress = Callable[[str], None]

DATA_ETAG_TAG = "smtriton:model-data-etag"  # the model archive's S3 ETag when the model was made
SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)


def _quiet(_: str) -> None:
    pass


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
    instance_count: int = 1
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

    def model(self) -> ServingModel:
        return ServingModel(
            self.image, self.role_arn, self.model_data, self.multi_model, self.environment, self.default_model,
            self.async_inference is not None, self.hosting,
        )  # fmt: skip


@dataclass
class Aws:
    """The boto3 clients a deployment uses. CloudWatch holds the alarm of an asynchronous endpoint's
    scale-out from zero; S3 and ECR tell whether a redeploy changes anything (without them, it always
    updates)."""

    sagemaker: Any
    autoscaling: Any
    cloudwatch: Any = None
    s3: Any = None
    ecr: Any = None

    @classmethod
    def from_session(cls, session: Any, endpoint_url: str | None = None) -> Aws:
        def client(name: str) -> Any:
            return session.client(name, endpoint_url=endpoint_url)

        return cls(client("sagemaker"), client("application-autoscaling"), client("cloudwatch"), client("s3"),
                   client("ecr"))  # fmt: skip


@dataclass(frozen=True)
class DeployResult:
    endpoint_name: str
    endpoint_arn: str
    model_name: str
    config_name: str
    updated: bool
    removed: tuple[str, ...] = ()
    unchanged: bool = False  # the endpoint already ran this deployment: nothing was made
    component: str | None = None  # the inference component deployed on the endpoint


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
        if spec.instance_count < 1:
            raise DeployError("instance count must be at least 1")
        ami.choose("endpoint", spec.instance_type, spec.ami_version)  # refused before anything is made
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
        count = spec.instance_count if instance_count is None else instance_count
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


def describe_endpoint(sm: Any, name: str) -> dict[str, Any] | None:
    """DescribeEndpoint, or None when there is no such endpoint."""
    return described_or_none(sm.describe_endpoint, EndpointName=name)


def wait_in_service(poller: Poller, sm: Any, name: str) -> Mapping[str, Any]:
    described = poller.until(
        f"endpoint {name}",
        lambda: describe_endpoint(sm, name),
        status_key="EndpointStatus",
        done={"InService"},
        failed={"Failed", "UpdateRollbackFailed"},
        hint=f" (smtriton delete-endpoint {name} removes it)",
    )
    assert described is not None
    return described


def wait_deleted(poller: Poller, sm: Any, name: str) -> None:
    poller.until(
        f"endpoint {name}",
        lambda: describe_endpoint(sm, name),
        status_key="EndpointStatus",
        done=(),
        failed={"Failed"},
        gone_is_done=True,
    )


def _describe_config(sm: Any, name: str) -> dict[str, Any] | None:
    return described_or_none(sm.describe_endpoint_config, EndpointConfigName=name)


def _delete_config_and_models(
    sm: Any, config: Mapping[str, Any] | None, endpoint_name: str, force: bool, progress: Progress
) -> list[str]:
    """Delete an endpoint configuration (as described) and the models its variants use, when they are
    ours (or forced)."""
    from botocore.exceptions import ClientError

    removed: list[str] = []
    if config is None:
        return removed
    config_name = config["EndpointConfigName"]
    models = [v["ModelName"] for v in config.get("ProductionVariants", []) if v.get("ModelName")]
    if force or is_managed(sm, config["EndpointConfigArn"], endpoint_name):
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        removed.append(f"endpoint-config/{config_name}")
        progress(f"deleted endpoint configuration {config_name}")
    for model in models:
        try:
            described = sm.describe_model(ModelName=model)
        except ClientError:
            continue
        if force or is_managed(sm, described["ModelArn"], endpoint_name):
            sm.delete_model(ModelName=model)
            removed.append(f"model/{model}")
            progress(f"deleted model {model}")
    return removed


def read_scaling(aas: Any, endpoint_name: str, progress: Progress, when: str) -> scaling.Snapshot | None:
    """The variant's auto-scaling; None when there is none, or when the caller may not read it (said)."""
    from botocore.exceptions import ClientError

    try:
        return scaling.read(aas, endpoint_name)
    except ClientError as exc:
        if not is_access_denied(exc):
            raise
        progress(
            f"warning: cannot read the auto-scaling of endpoint {endpoint_name} ({error_text(exc)}); {when} as if it "
            "had none (grant application-autoscaling:DescribeScalableTargets and DescribeScalingPolicies to check)"
        )
        return None


@dataclass(frozen=True)
class _Current:
    """What serves now, read before an update."""

    endpoint: Mapping[str, Any]
    config: Mapping[str, Any]
    model: Mapping[str, Any] | None
    scaling: scaling.Snapshot | None

    @property
    def variant(self) -> Mapping[str, Any]:
        variants = self.config.get("ProductionVariants") or [{}]
        return variants[0]

    @property
    def instances(self) -> int | None:
        summary = (self.endpoint.get("ProductionVariants") or [{}])[0]
        count = summary.get("DesiredInstanceCount", summary.get("CurrentInstanceCount"))
        return int(count) if count is not None else None


def _read_current(aws: Aws, existing: Mapping[str, Any], progress: Progress) -> _Current:
    sm = aws.sagemaker
    config = sm.describe_endpoint_config(EndpointConfigName=existing["EndpointConfigName"])
    model_name = (config.get("ProductionVariants") or [{}])[0].get("ModelName")
    model = described_or_none(sm.describe_model, ModelName=model_name) if model_name else None
    snapshot = read_scaling(aws.autoscaling, existing["EndpointName"], progress, "updating it")
    return _Current(existing, config, model, snapshot)


def _instance_count(spec: EndpointSpec, current: _Current | None, progress: Progress) -> int:
    """An auto-scaled variant keeps the instances it runs now (within the limits it will have), unless
    its instance type changes: a redeploy must not drop a scaled-out endpoint to ``--instance-count``."""
    if current is None or current.scaling is None or spec.serverless is not None or spec.remove_autoscaling:
        return spec.instance_count
    if current.variant.get("InstanceType") != spec.instance_type or current.instances is None:
        return spec.instance_count
    low, high = (
        (spec.autoscaling.min_capacity, spec.autoscaling.max_capacity) if spec.autoscaling else current.scaling.limits
    )
    count = min(max(current.instances, low, 1), high)
    if count != spec.instance_count:
        progress(
            f"keeping {count} instances: the endpoint is auto-scaled (--instance-count {spec.instance_count} "
            "applies to a new endpoint or a new instance type)"
        )
    return count


def _data_etag(s3: Any, url: str | None, progress: Progress) -> str | None:
    """The S3 ETag of a model archive (None for a prefix, or when it cannot be read: never fatal, since
    the execution role, not the caller, reads the model data)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if s3 is None or url is None or not url.endswith(".tar.gz"):
        return None
    bucket, _, key = url.removeprefix("s3://").partition("/")
    try:
        etag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            progress(f"warning: {url} does not exist (yet): SageMaker fails to start without it")
        return None
    return str(etag).strip('"')


# What a variant of ours can carry: two configurations with the same of these serve the same.
_VARIANT_KEYS = ("InstanceType", "InferenceAmiVersion", "InitialInstanceCount", "InitialVariantWeight",
                 "ServerlessConfig", "ContainerStartupHealthCheckTimeoutInSeconds", "VolumeSizeInGB",
                 "ModelDataDownloadTimeoutInSeconds")  # fmt: skip
_CONFIG_KEYS = ("AsyncInferenceConfig", "DataCaptureConfig", "KmsKeyId")
_CONTAINER_KEYS = ("Image", "Mode", "ModelDataUrl", "ModelDataSource", "Environment")


def _differences(
    aws: Aws, spec: EndpointSpec, current: _Current, model: Mapping[str, Any], config: Mapping[str, Any]
) -> str | None:
    """What an update would change, in a few words; None when it would change nothing."""
    if current.model is None:
        return "the model in service is gone"
    if current.model.get("ExecutionRoleArn") != model["ExecutionRoleArn"]:
        return "another execution role"
    if current.model.get("VpcConfig") != model.get("VpcConfig"):
        return "another VPC"
    if bool(current.model.get("EnableNetworkIsolation")) != bool(model.get("EnableNetworkIsolation")):
        return "another network isolation"
    described = current.model.get("PrimaryContainer", {})
    for key in _CONTAINER_KEYS:
        if (described.get(key) or None) != (model["PrimaryContainer"].get(key) or None):
            return f"another {key}"
    keep_count = current.scaling is not None
    ours, theirs = config["ProductionVariants"][0], current.variant
    for key in _VARIANT_KEYS:
        if key == "InitialInstanceCount" and keep_count:
            continue
        if theirs.get(key) != ours.get(key):
            return f"another {key}"
    for key in _CONFIG_KEYS:
        if current.config.get(key) != config.get(key):
            return f"another {key}"
    if not _same_image(aws.ecr, spec.image, current.endpoint):
        return "the image may have changed (its tag is not proven to name the digest in service)"
    if spec.model_data and spec.model_data.endswith(".tar.gz") and not spec.multi_model:
        wanted = next((t["Value"] for t in model["Tags"] if t["Key"] == DATA_ETAG_TAG), None)
        recorded = _model_tag(aws.sagemaker, current.model["ModelArn"], DATA_ETAG_TAG)
        if wanted is None or wanted != recorded:
            return "the model archive may have changed (its ETag is not the one in service)"
    elif spec.model_data and not spec.multi_model:
        return "an uncompressed model prefix, whose content cannot be compared"
    return None


def _model_tag(sm: Any, arn: str, key: str) -> str | None:
    return next((t["Value"] for t in sm.list_tags(ResourceArn=arn).get("Tags", []) if t["Key"] == key), None)


_ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


def _same_image(ecr: Any, image: str, described: Mapping[str, Any]) -> bool:
    """Whether ``image`` names the digest SageMaker resolved when the endpoint was deployed."""
    from botocore.exceptions import BotoCoreError, ClientError

    deployed = [d for v in described.get("ProductionVariants", []) for d in v.get("DeployedImages", [])]
    resolved = {str(d.get("ResolvedImage", "")).rpartition("@")[2] for d in deployed if d["SpecifiedImage"] == image}
    if len(resolved) != 1 or not next(iter(resolved)).startswith("sha256:"):
        return False
    m = _ECR_IMAGE.match(image)
    if m is None:
        return False
    digest = m.group("digest")
    if digest is None:
        if ecr is None or ecr.meta.region_name != m.group("region"):
            return False
        try:
            found = ecr.describe_images(
                registryId=m.group("account"),
                repositoryName=m.group("repository"),
                imageIds=[{"imageTag": m.group("tag") or "latest"}],
            )["imageDetails"]
        except (ClientError, BotoCoreError):
            return False
        digest = found[0]["imageDigest"] if found else None
    return digest in resolved


def deploy(
    aws: Aws,
    spec: EndpointSpec,
    *,
    progress: Progress = _quiet,
    poll_s: float = 30.0,
    timeout_s: float = 3600.0,
    keep_failed: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> DeployResult:
    """Create the endpoint, or update it in place when it exists; wait until it is InService.

    A failed create is rolled back (endpoint, configuration, model deleted) unless ``keep_failed``; a
    failed update leaves SageMaker's rollback (the previous configuration) in service, deletes the
    new configuration and model, and puts back auto-scaling the update had to remove.
    """
    for warning in validate(spec):
        progress(f"warning: {warning}")
    sm = aws.sagemaker
    poller = Poller(progress, poll_s, timeout_s, sleep, clock)
    existing = _settled(sm, spec.name, poller, progress)
    if spec.inference_component is not None:
        return _deploy_component(aws, spec, existing, poller, keep_failed, progress)
    current = None
    if existing is not None:
        if not is_managed(sm, existing["EndpointArn"], spec.name):
            raise DeployError(f"endpoint {spec.name} exists and was not created by smtriton; not touching it")
        current = _read_current(aws, existing, progress)

    model_name = resource_name(spec.name)
    config_name = model_name
    model = model_request(spec, model_name, _data_etag(aws.s3, spec.model_data, progress))
    config = endpoint_config_request(spec, config_name, model_name, _instance_count(spec, current, progress))
    if current is not None:
        change = _differences(aws, spec, current, model, config)
        if change is None:
            return _unchanged(aws, spec, current, progress)
        progress(f"updating endpoint {spec.name}: {change}")
    created: list[str] = []
    try:
        sm.create_model(**model)
        created.append("model")
        progress(f"created model {model_name}")
        sm.create_endpoint_config(**config)
        created.append("config")
        progress(f"created endpoint configuration {config_name}")
    except Exception:
        _rollback(sm, created, model_name, config_name, progress)
        raise

    if current is None:
        return _create(aws, spec, model_name, config_name, poller, keep_failed, progress)
    return _update(aws, spec, current, model_name, config_name, poller, progress)


def _settled(sm: Any, name: str, poller: Poller, progress: Progress) -> Mapping[str, Any] | None:
    """The endpoint once it is InService (waiting through a change under way), or None when there is none."""
    existing = describe_endpoint(sm, name)
    if existing is None:
        return None
    status = existing["EndpointStatus"]
    if status in ("Creating", "Updating", "SystemUpdating", "RollingBack", "UpdateRollbackFailed"):
        progress(f"endpoint {name} is {status}; waiting before updating it")
        return wait_in_service(poller, sm, name)
    if status != "InService":
        raise DeployError(f"endpoint {name} is {status}; delete it first (smtriton delete-endpoint {name})")
    return existing


def _deploy_component(
    aws: Aws,
    spec: EndpointSpec,
    existing: Mapping[str, Any] | None,
    poller: Poller,
    keep_failed: bool,
    progress: Progress,
) -> DeployResult:
    """The endpoint (made for inference components when missing) and the component on it."""
    sm, component = aws.sagemaker, spec.inference_component
    assert component is not None
    fresh = existing is None
    if existing is None:
        config_name = resource_name(spec.name)
        sm.create_endpoint_config(**endpoint_config_request(spec, config_name, None))
        progress(f"created endpoint configuration {config_name} (for inference components)")
        arn = _start_endpoint(sm, spec, ["config"], "", config_name, poller, keep_failed, progress)
    else:
        config_name, arn = existing["EndpointConfigName"], existing["EndpointArn"]
        variants = sm.describe_endpoint_config(EndpointConfigName=config_name).get("ProductionVariants", [])
        if any(v.get("ModelName") for v in variants):
            raise DeployError(
                f"endpoint {spec.name} serves a model itself; inference components need an endpoint made for "
                "them: give another endpoint name"
            )
        if variants and variants[0].get("InstanceType") != spec.instance_type:
            progress(f"endpoint {spec.name} runs {variants[0].get('InstanceType')}; the component goes there")
    try:
        result = components.deploy_component(
            sm, component, spec.name, spec.model(), extra_tags=spec.tags, startup_timeout_s=spec.startup_timeout_s,
            poller=poller, progress=progress,
        )  # fmt: skip
    except DeployError as exc:
        if fresh and not keep_failed and not isinstance(exc, WaitTimeout):
            _roll_back_endpoint(sm, spec.name, poller, progress)
            _rollback(sm, ["config"], "", config_name, progress)
        raise
    return DeployResult(spec.name, arn, result.model_name, config_name, result.updated, component=component.name)


def _start_endpoint(
    sm: Any,
    spec: EndpointSpec,
    made: list[str],
    model_name: str,
    config_name: str,
    poller: Poller,
    keep_failed: bool,
    progress: Progress,
) -> str:
    """CreateEndpoint on the configuration just made, and the wait until it is InService; an endpoint
    that fails goes, with what ``made`` names (the configuration, the model), unless ``keep_failed``."""
    try:
        arn: str = sm.create_endpoint(
            EndpointName=spec.name, EndpointConfigName=config_name, Tags=tags(MANAGED_TAG, spec.name, spec.tags)
        )["EndpointArn"]
    except Exception:
        _rollback(sm, made, model_name, config_name, progress)
        raise
    progress(f"creating endpoint {spec.name}")
    try:
        wait_in_service(poller, sm, spec.name)
    except WaitTimeout:
        raise
    except DeployError:
        if not keep_failed:
            _roll_back_endpoint(sm, spec.name, poller, progress)
            _rollback(sm, made, model_name, config_name, progress)
        raise
    return arn


def _roll_back_endpoint(sm: Any, name: str, poller: Poller, progress: Progress) -> None:
    from botocore.exceptions import ClientError

    progress(f"rolling back {name}")
    try:
        sm.delete_endpoint(EndpointName=name)
    except ClientError as exc:
        if is_not_found(exc):  # gone already
            return
        raise
    wait_deleted(poller, sm, name)


def _unchanged(aws: Aws, spec: EndpointSpec, current: _Current, progress: Progress) -> DeployResult:
    """Nothing to update; auto-scaling is still put (or removed) as asked."""
    asynchronous = spec.async_inference is not None
    progress(f"endpoint {spec.name} unchanged: it already runs this image, model data and configuration")
    if spec.autoscaling is not None:
        scaling.apply(aws.autoscaling, aws.cloudwatch, spec.name, spec.autoscaling, asynchronous, progress)
    elif spec.remove_autoscaling and current.scaling is not None:
        scaling.deregister(aws.autoscaling, aws.cloudwatch, spec.name, current.scaling, progress)
    model_name = current.model["ModelName"] if current.model else ""
    return DeployResult(
        spec.name, current.endpoint["EndpointArn"], model_name, current.config["EndpointConfigName"], False,
        unchanged=True,
    )  # fmt: skip


def _rollback(sm: Any, created: list[str], model_name: str, config_name: str, progress: Progress) -> None:
    if "config" in created:
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        progress(f"rolled back endpoint configuration {config_name}")
    if "model" in created:
        sm.delete_model(ModelName=model_name)
        progress(f"rolled back model {model_name}")


def _create(
    aws: Aws,
    spec: EndpointSpec,
    model_name: str,
    config_name: str,
    poller: Poller,
    keep_failed: bool,
    progress: Progress,
) -> DeployResult:
    sm = aws.sagemaker
    arn = _start_endpoint(sm, spec, ["model", "config"], model_name, config_name, poller, keep_failed, progress)
    if spec.autoscaling is not None:
        asynchronous = spec.async_inference is not None
        scaling.apply(aws.autoscaling, aws.cloudwatch, spec.name, spec.autoscaling, asynchronous, progress)
    return DeployResult(spec.name, arn, model_name, config_name, updated=False)


def _update(
    aws: Aws,
    spec: EndpointSpec,
    current: _Current,
    model_name: str,
    config_name: str,
    poller: Poller,
    progress: Progress,
) -> DeployResult:
    sm, aas, cw = aws.sagemaker, aws.autoscaling, aws.cloudwatch
    old_config = current.config["EndpointConfigName"]
    snapshot = current.scaling
    # Application Auto Scaling refuses an update that changes the instance type (or drops the instances) of
    # a registered variant: deregister first, and put the registration back afterwards.
    lifted = snapshot is not None and (
        spec.serverless is not None or current.variant.get("InstanceType") != spec.instance_type
    )
    if lifted:
        assert snapshot is not None
        scaling.deregister(aas, cw, spec.name, snapshot, progress)

    def put_back() -> None:
        if lifted:
            assert snapshot is not None
            scaling.restore(aas, cw, spec.name, snapshot, progress)

    try:
        sm.update_endpoint(EndpointName=spec.name, EndpointConfigName=config_name)
    except Exception:
        _rollback(sm, ["model", "config"], model_name, config_name, progress)
        put_back()
        raise
    progress(f"updating endpoint {spec.name}: {old_config} -> {config_name}")
    try:
        described = wait_in_service(poller, sm, spec.name)
    except WaitTimeout as exc:
        if lifted:
            raise WaitTimeout(
                f"{exc}; its auto-scaling was removed for the new instance type: deploy again with --autoscale-max "
                "once it is InService"
            ) from None
        raise
    except DeployError:
        found = describe_endpoint(sm, spec.name)
        if found is None or found.get("EndpointConfigName") == config_name:
            raise
        described = found
    if described.get("EndpointConfigName") != config_name:
        reason = described.get("FailureReason") or "SageMaker rolled the update back"
        _rollback(sm, ["model", "config"], model_name, config_name, progress)
        put_back()
        raise DeployError(f"update of {spec.name} failed, the previous configuration still serves: {reason}")
    if spec.autoscaling is not None:
        scaling.apply(aas, cw, spec.name, spec.autoscaling, spec.async_inference is not None, progress)
    elif spec.remove_autoscaling:
        if snapshot is not None and not lifted:
            scaling.deregister(aas, cw, spec.name, snapshot, progress)
    elif spec.serverless is None:
        put_back()
    removed = _delete_config_and_models(sm, _describe_config(sm, old_config), spec.name, False, progress)
    return DeployResult(spec.name, described["EndpointArn"], model_name, config_name, True, tuple(removed))


def _leftovers(sm: Any, endpoint_name: str) -> tuple[list[str], list[str]]:
    """Endpoint configurations and models tagged for this endpoint that no endpoint uses (failed runs)."""
    prefix = name_prefix(endpoint_name)
    configs = [
        c["EndpointConfigName"]
        for page in sm.get_paginator("list_endpoint_configs").paginate(NameContains=prefix)
        for c in page["EndpointConfigs"]
        if is_managed(sm, c["EndpointConfigArn"], endpoint_name)
    ]
    models = [
        m["ModelName"]
        for page in sm.get_paginator("list_models").paginate(NameContains=prefix)
        for m in page["Models"]
        if is_managed(sm, m["ModelArn"], endpoint_name)
    ]
    return configs, models


def delete_endpoint(
    aws: Aws,
    name: str,
    *,
    force: bool = False,
    component: str | None = None,
    progress: Progress = _quiet,
    poll_s: float = 30.0,
    timeout_s: float = 1800.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Delete the endpoint, its auto-scaling, configuration and models, and any leftovers of failed runs.

    Only resources tagged ``smtriton:endpoint=<name>`` are deleted, unless ``force``. Returns what was
    removed. Its inference components go first (with ``component``, only that one, and the endpoint
    stays). A caller without Application Auto Scaling rights still deletes the endpoint (and is told
    that a registration, if any, stays).
    """
    sm = aws.sagemaker
    poller = Poller(progress, poll_s, timeout_s, sleep, clock)
    if component is not None:
        return components.delete_components(sm, name, only=component, force=force, poller=poller, progress=progress)
    removed: list[str] = []
    existing = describe_endpoint(sm, name)
    if existing is not None:
        if not force and not is_managed(sm, existing["EndpointArn"], name):
            raise DeployError(f"endpoint {name} was not created by smtriton; pass force to delete it anyway")
        config = _describe_config(sm, existing["EndpointConfigName"])
        if config is not None and not any(v.get("ModelName") for v in config.get("ProductionVariants", [])):
            # an endpoint for inference components: SageMaker deletes it only once they are gone
            removed += components.delete_components(sm, name, force=force, poller=poller, progress=progress)
        snapshot = read_scaling(aws.autoscaling, name, progress, "deleting it")
        if snapshot is not None:
            scaling.deregister(aws.autoscaling, aws.cloudwatch, name, snapshot, progress)
            removed.append(f"scalable-target/{scaling.resource_id(name)}")
        sm.delete_endpoint(EndpointName=name)
        progress(f"deleting endpoint {name}")
        wait_deleted(poller, sm, name)
        removed.append(f"endpoint/{name}")
        removed += _delete_config_and_models(sm, config, name, force, progress)
    configs, models = _leftovers(sm, name)
    for config_name in configs:
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        removed.append(f"endpoint-config/{config_name}")
        progress(f"deleted endpoint configuration {config_name}")
    for model in models:
        sm.delete_model(ModelName=model)
        removed.append(f"model/{model}")
        progress(f"deleted model {model}")
    return removed
