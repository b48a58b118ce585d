"""Deploy the serving image to SageMaker: single-model (SME) and multi-model (MME) endpoints.

One call creates — or updates in place — a model, an endpoint configuration and an endpoint, waits
with boto3's waiters while printing progress, and optionally attaches a target-tracking auto-scaling
policy on ``SageMakerVariantInvocationsPerInstance``. Everything it creates carries the tag
``smtriton:endpoint=<endpoint name>``, and :func:`delete_endpoint` removes exactly what carries it, so
nothing is left behind: a failed create is rolled back, and an update deletes the configuration and
model it replaced.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from smtriton.aws.docker_image import is_sagemaker_triton_image
from smtriton.errors import ToolError

Progress = Callable[[str], None]

VARIANT = "AllTraffic"
MANAGED_TAG = "smtriton:endpoint"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
SCALING_METRIC = "SageMakerVariantInvocationsPerInstance"
NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
GPU_INSTANCE_RE = re.compile(r"^ml\.(p\d+[a-z]*|g\d+[a-z]*)\.")
SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)
ASYNC_REQUEST_TIMEOUT_S = 3600  # asynchronous inference allows up to one hour per request
ASYNC_MAX_PAYLOAD_BYTES = 1024**3  # and up to 1 GB of payload


class DeployError(ToolError, RuntimeError):
    """The deployment is invalid, or SageMaker reported a failure."""


class WaitTimeout(DeployError):
    """SageMaker is still working on the endpoint when our patience ran out (nothing is rolled back)."""


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
class AutoScaling:
    min_capacity: int = 1
    max_capacity: int = 2
    target_invocations: float = 100.0  # invocations per instance per minute
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60


@dataclass(frozen=True)
class EndpointSpec:
    """One endpoint. ``model_data``: SME a ``model.tar.gz`` or an S3 prefix (uncompressed), MME a prefix."""

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
    startup_timeout_s: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    # What the image was built on (its org.opencontainers.image.base.name label), when known.
    base_image: str | None = None


@dataclass
class Aws:
    """The boto3 clients a deployment uses."""

    sagemaker: Any
    autoscaling: Any

    @classmethod
    def from_session(cls, session: Any, endpoint_url: str | None = None) -> Aws:
        return cls(
            sagemaker=session.client("sagemaker", endpoint_url=endpoint_url),
            autoscaling=session.client("application-autoscaling", endpoint_url=endpoint_url),
        )


@dataclass(frozen=True)
class DeployResult:
    endpoint_name: str
    endpoint_arn: str
    model_name: str
    config_name: str
    updated: bool
    removed: tuple[str, ...] = ()


def is_gpu_instance(instance_type: str | None) -> bool:
    return bool(instance_type and GPU_INSTANCE_RE.match(instance_type))


def _is_s3(url: str) -> bool:
    return url.startswith("s3://") and len(url) > 5 and not url[5:].startswith("/")


def environment(spec: EndpointSpec) -> dict[str, str]:
    """The container environment: the user's variables plus what the endpoint type implies."""
    env = {str(k): str(v) for k, v in spec.environment.items()}
    if spec.multi_model:
        env["SAGEMAKER_MULTI_MODEL"] = "true"
    if spec.default_model:
        env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = spec.default_model
    if spec.async_inference is not None:
        env.setdefault("SMTRITON_REQUEST_TIMEOUT_S", str(ASYNC_REQUEST_TIMEOUT_S))
        env.setdefault("SMTRITON_MAX_PAYLOAD_BYTES", str(ASYNC_MAX_PAYLOAD_BYTES))
    return env


def validate(spec: EndpointSpec) -> list[str]:
    """Raise DeployError for a spec SageMaker (or Triton) cannot run; return warnings for dubious ones."""
    warnings: list[str] = []
    if not NAME_RE.match(spec.name):
        raise DeployError(f"endpoint name {spec.name!r}: letters, digits and single hyphens, at most 63 characters")
    if not spec.role_arn.startswith("arn:"):
        raise DeployError(f"execution role {spec.role_arn!r} is not an IAM role ARN")
    if spec.multi_model:
        if not spec.model_data or not _is_s3(spec.model_data) or spec.model_data.endswith(".tar.gz"):
            raise DeployError("a multi-model endpoint needs an S3 prefix (s3://bucket/prefix/) holding the archives")
        if spec.default_model:
            raise DeployError("a multi-model endpoint has no default model: clients name one with TargetModel")
    elif spec.model_data is None:
        warnings.append("no model data: the image itself must hold the model repository in /opt/ml/model")
    elif not _is_s3(spec.model_data) or not (spec.model_data.endswith(".tar.gz") or spec.model_data.endswith("/")):
        raise DeployError(
            f"model data {spec.model_data!r}: give s3://.../model.tar.gz, or an S3 prefix ending in '/' "
            "holding the uncompressed repository"
        )
    env = environment(spec)
    # Imported here: the runtime's settings schema (pydantic) is needed only once a deployment is checked.
    from smtriton.serve.settings import Settings, SettingsError, known_variables, variables_without_effect

    known = known_variables()
    for key in env:
        if key.startswith(("SAGEMAKER_", "SMTRITON_")) and key not in known:
            warnings.append(f"{key} is not a variable serve knows; it will be ignored")
    for key, why in variables_without_effect(env):
        warnings.append(f"{key} has no effect: {why}")
    try:
        Settings.from_env(env)
    except SettingsError as exc:
        raise DeployError(f"environment: {exc}") from None

    if spec.serverless is not None:
        s = spec.serverless
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
    if spec.async_inference is not None:
        a = spec.async_inference
        if spec.multi_model:
            raise DeployError("asynchronous inference endpoints cannot be multi-model endpoints")
        for path in (a.output_path, a.failure_path):
            if path is not None and not _is_s3(path):
                raise DeployError(f"asynchronous inference output {path!r} must be an s3:// location")
    if spec.autoscaling is not None:
        sc = spec.autoscaling
        floor = 0 if spec.async_inference is not None else 1
        if sc.min_capacity < floor or sc.max_capacity < sc.min_capacity:
            raise DeployError(f"auto-scaling needs {floor} <= min capacity <= max capacity")
        if sc.target_invocations <= 0:
            raise DeployError("auto-scaling target must be a positive number of invocations per instance")
        if spec.async_inference is not None:
            warnings.append(
                f"auto-scaling an asynchronous endpoint on {SCALING_METRIC}: AWS suggests "
                "ApproximateBacklogSizePerInstance for queues"
            )
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


def _tags(spec: EndpointSpec) -> list[dict[str, str]]:
    tags = [{"Key": str(k), "Value": str(v)} for k, v in spec.tags.items() if k != MANAGED_TAG]
    return [{"Key": MANAGED_TAG, "Value": spec.name}, *tags]


def model_request(spec: EndpointSpec, model_name: str) -> dict[str, Any]:
    """The CreateModel request."""
    container: dict[str, Any] = {"Image": spec.image, "Mode": "MultiModel" if spec.multi_model else "SingleModel"}
    if spec.model_data is not None:
        if spec.multi_model or spec.model_data.endswith(".tar.gz"):
            container["ModelDataUrl"] = spec.model_data.rstrip("/") + "/" if spec.multi_model else spec.model_data
        else:
            container["ModelDataSource"] = {
                "S3DataSource": {"S3Uri": spec.model_data, "S3DataType": "S3Prefix", "CompressionType": "None"}
            }
    env = environment(spec)
    if env:
        container["Environment"] = env
    return {
        "ModelName": model_name,
        "ExecutionRoleArn": spec.role_arn,
        "PrimaryContainer": container,
        "Tags": _tags(spec),
    }


def endpoint_config_request(spec: EndpointSpec, config_name: str, model_name: str) -> dict[str, Any]:
    """The CreateEndpointConfig request (one variant, all traffic)."""
    variant: dict[str, Any] = {"VariantName": VARIANT, "ModelName": model_name}
    if spec.serverless is not None:
        serverless: dict[str, Any] = {
            "MemorySizeInMB": spec.serverless.memory_mb,
            "MaxConcurrency": spec.serverless.max_concurrency,
        }
        if spec.serverless.provisioned_concurrency is not None:
            serverless["ProvisionedConcurrency"] = spec.serverless.provisioned_concurrency
        variant["ServerlessConfig"] = serverless
    else:
        variant.update(
            InstanceType=spec.instance_type, InitialInstanceCount=spec.instance_count, InitialVariantWeight=1.0
        )
        if spec.startup_timeout_s is not None:
            variant["ContainerStartupHealthCheckTimeoutInSeconds"] = spec.startup_timeout_s
    request: dict[str, Any] = {"EndpointConfigName": config_name, "ProductionVariants": [variant], "Tags": _tags(spec)}
    if spec.async_inference is not None:
        a = spec.async_inference
        output: dict[str, Any] = {"S3OutputPath": a.output_path}
        if a.failure_path:
            output["S3FailurePath"] = a.failure_path
        notify = {k: v for k, v in (("SuccessTopic", a.success_topic), ("ErrorTopic", a.error_topic)) if v}
        if notify:
            output["NotificationConfig"] = notify
        config: dict[str, Any] = {"OutputConfig": output}
        if a.max_concurrent_invocations is not None:
            config["ClientConfig"] = {"MaxConcurrentInvocationsPerInstance": a.max_concurrent_invocations}
        request["AsyncInferenceConfig"] = config
    return request


def resource_name(endpoint_name: str, now: datetime | None = None) -> str:
    """A fresh model / endpoint-config name: the endpoint's name, a UTC time stamp and a random suffix."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d%H%M%S")
    return f"{endpoint_name[:43].rstrip('-')}-{stamp}-{secrets.token_hex(2)}"


def _scaling_resource(endpoint_name: str) -> str:
    return f"endpoint/{endpoint_name}/variant/{VARIANT}"


def scaling_requests(endpoint_name: str, scaling: AutoScaling) -> tuple[dict[str, Any], dict[str, Any]]:
    """The RegisterScalableTarget and PutScalingPolicy requests."""
    target = {
        "ServiceNamespace": "sagemaker",
        "ResourceId": _scaling_resource(endpoint_name),
        "ScalableDimension": SCALABLE_DIMENSION,
        "MinCapacity": scaling.min_capacity,
        "MaxCapacity": scaling.max_capacity,
    }
    policy = {
        "PolicyName": f"{endpoint_name}-invocations-per-instance",
        "ServiceNamespace": "sagemaker",
        "ResourceId": _scaling_resource(endpoint_name),
        "ScalableDimension": SCALABLE_DIMENSION,
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": float(scaling.target_invocations),
            "PredefinedMetricSpecification": {"PredefinedMetricType": SCALING_METRIC},
            "ScaleInCooldown": scaling.scale_in_cooldown_s,
            "ScaleOutCooldown": scaling.scale_out_cooldown_s,
        },
    }
    return target, policy


class _Waiting:
    """boto3 waiters, one attempt at a time, so progress can be printed between attempts."""

    def __init__(
        self,
        progress: Progress,
        poll_s: float,
        timeout_s: float,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self.progress, self.poll_s, self.timeout_s = progress, poll_s, timeout_s
        self.sleep, self.clock = sleep, clock

    def endpoint(self, sm: Any, name: str, waiter_name: str) -> dict[str, Any] | None:
        """Wait with ``endpoint_in_service`` or ``endpoint_deleted``; raise DeployError on a failure state."""
        from botocore.exceptions import WaiterError

        waiter = sm.get_waiter(waiter_name)
        start = self.clock()
        while True:
            try:
                waiter.wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 1})
            except WaiterError as exc:
                response = exc.last_response or {}
                if "Max attempts exceeded" not in str(exc):
                    reason = response.get("FailureReason") or response.get("Error", {}).get("Message") or str(exc)
                    status = response.get("EndpointStatus", "failing")
                    raise DeployError(f"endpoint {name} is {status}: {reason}") from None
                elapsed = self.clock() - start
                self.progress(f"endpoint {name}: {response.get('EndpointStatus', '?')} ({elapsed:.0f} s)")
                if elapsed > self.timeout_s:
                    raise WaitTimeout(
                        f"endpoint {name} still {response.get('EndpointStatus', '?')} after {self.timeout_s:.0f} s; "
                        "SageMaker goes on with it (smtriton delete-endpoint removes it)"
                    ) from None
                self.sleep(self.poll_s)
                continue
            if waiter_name == "endpoint_deleted":
                self.progress(f"endpoint {name}: deleted")
                return None
            described = sm.describe_endpoint(EndpointName=name)
            self.progress(f"endpoint {name}: {described['EndpointStatus']}")
            return described


def _client_error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def describe_endpoint(sm: Any, name: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        return sm.describe_endpoint(EndpointName=name)
    except ClientError as exc:
        if _client_error_code(exc) == "ValidationException" and "Could not find" in str(exc):
            return None
        raise


def _managed(sm: Any, arn: str, endpoint_name: str) -> bool:
    tags = sm.list_tags(ResourceArn=arn).get("Tags", [])
    return any(t["Key"] == MANAGED_TAG and t["Value"] == endpoint_name for t in tags)


def _delete_config_and_models(
    sm: Any, config_name: str, endpoint_name: str, force: bool, progress: Progress
) -> list[str]:
    """Delete an endpoint configuration and the models its variants use, when they are ours (or forced)."""
    from botocore.exceptions import ClientError

    removed: list[str] = []
    try:
        config = sm.describe_endpoint_config(EndpointConfigName=config_name)
    except ClientError:
        return removed
    models = [v["ModelName"] for v in config.get("ProductionVariants", [])]
    if force or _managed(sm, config["EndpointConfigArn"], endpoint_name):
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        removed.append(f"endpoint-config/{config_name}")
        progress(f"deleted endpoint configuration {config_name}")
    for model in models:
        try:
            described = sm.describe_model(ModelName=model)
        except ClientError:
            continue
        if force or _managed(sm, described["ModelArn"], endpoint_name):
            sm.delete_model(ModelName=model)
            removed.append(f"model/{model}")
            progress(f"deleted model {model}")
    return removed


def _deregister_scaling(aas: Any, endpoint_name: str, progress: Progress) -> bool:
    resource = _scaling_resource(endpoint_name)
    found = aas.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[resource], ScalableDimension=SCALABLE_DIMENSION
    )["ScalableTargets"]
    if not found:
        return False
    aas.deregister_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=resource, ScalableDimension=SCALABLE_DIMENSION
    )
    progress(f"deregistered auto-scaling of {resource}")
    return True


def _apply_scaling(aas: Any, endpoint_name: str, scaling: AutoScaling, progress: Progress) -> None:
    target, policy = scaling_requests(endpoint_name, scaling)
    aas.register_scalable_target(**target)
    aas.put_scaling_policy(**policy)
    progress(
        f"auto-scaling {scaling.min_capacity}-{scaling.max_capacity} instances, target "
        f"{scaling.target_invocations:g} {SCALING_METRIC}"
    )


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
    failed update leaves SageMaker's rollback (the previous configuration) in service and deletes the
    new configuration and model.
    """
    for warning in validate(spec):
        progress(f"warning: {warning}")
    sm = aws.sagemaker
    waiting = _Waiting(progress, poll_s, timeout_s, sleep, clock)
    existing = describe_endpoint(sm, spec.name)
    if existing is not None:
        status = existing["EndpointStatus"]
        if status in ("Creating", "Updating", "SystemUpdating", "RollingBack", "UpdateRollbackFailed"):
            progress(f"endpoint {spec.name} is {status}; waiting before updating it")
            existing = waiting.endpoint(sm, spec.name, "endpoint_in_service")
        elif status != "InService":
            raise DeployError(
                f"endpoint {spec.name} is {status}; delete it first (smtriton delete-endpoint {spec.name})"
            )
        assert existing is not None
        if not _managed(sm, existing["EndpointArn"], spec.name):
            raise DeployError(f"endpoint {spec.name} exists and was not created by smtriton; not touching it")

    model_name = resource_name(spec.name)
    config_name = model_name
    created: list[str] = []
    try:
        sm.create_model(**model_request(spec, model_name))
        created.append("model")
        progress(f"created model {model_name}")
        sm.create_endpoint_config(**endpoint_config_request(spec, config_name, model_name))
        created.append("config")
        progress(f"created endpoint configuration {config_name}")
    except Exception:
        _rollback(sm, created, model_name, config_name, progress)
        raise

    if existing is None:
        return _create(aws, spec, model_name, config_name, waiting, keep_failed, progress)
    return _update(aws, spec, existing, model_name, config_name, waiting, progress)


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
    waiting: _Waiting,
    keep_failed: bool,
    progress: Progress,
) -> DeployResult:
    sm = aws.sagemaker
    try:
        arn = sm.create_endpoint(EndpointName=spec.name, EndpointConfigName=config_name, Tags=_tags(spec))[
            "EndpointArn"
        ]
    except Exception:
        _rollback(sm, ["model", "config"], model_name, config_name, progress)
        raise
    progress(f"creating endpoint {spec.name}")
    try:
        waiting.endpoint(sm, spec.name, "endpoint_in_service")
    except WaitTimeout:
        raise
    except DeployError:
        if not keep_failed:
            progress(f"rolling back {spec.name}")
            delete_endpoint(
                aws, spec.name, progress=progress, poll_s=waiting.poll_s, sleep=waiting.sleep, clock=waiting.clock
            )
        raise
    if spec.autoscaling is not None:
        _apply_scaling(aws.autoscaling, spec.name, spec.autoscaling, progress)
    return DeployResult(spec.name, arn, model_name, config_name, updated=False)


def _update(
    aws: Aws,
    spec: EndpointSpec,
    existing: dict[str, Any],
    model_name: str,
    config_name: str,
    waiting: _Waiting,
    progress: Progress,
) -> DeployResult:
    sm, aas = aws.sagemaker, aws.autoscaling
    old_config = existing["EndpointConfigName"]
    old_variants = sm.describe_endpoint_config(EndpointConfigName=old_config).get("ProductionVariants", [])
    old_type = old_variants[0].get("InstanceType") if old_variants else None
    # Application Auto Scaling refuses an update that changes the instance type (or drops the instances) of
    # a scaled variant: deregister first, register again afterwards.
    if spec.autoscaling is None or spec.serverless is not None or old_type != spec.instance_type:
        _deregister_scaling(aas, spec.name, progress)
    try:
        sm.update_endpoint(EndpointName=spec.name, EndpointConfigName=config_name)
    except Exception:
        _rollback(sm, ["model", "config"], model_name, config_name, progress)
        raise
    progress(f"updating endpoint {spec.name}: {old_config} -> {config_name}")
    try:
        described = waiting.endpoint(sm, spec.name, "endpoint_in_service")
    except WaitTimeout:
        raise
    except DeployError:
        described = describe_endpoint(sm, spec.name)
        if described is None or described.get("EndpointConfigName") == config_name:
            raise
    assert described is not None
    if described.get("EndpointConfigName") != config_name:
        reason = described.get("FailureReason") or "SageMaker rolled the update back"
        _rollback(sm, ["model", "config"], model_name, config_name, progress)
        raise DeployError(f"update of {spec.name} failed, the previous configuration still serves: {reason}")
    if spec.autoscaling is not None:
        _apply_scaling(aas, spec.name, spec.autoscaling, progress)
    removed = _delete_config_and_models(sm, old_config, spec.name, False, progress)
    return DeployResult(spec.name, described["EndpointArn"], model_name, config_name, True, tuple(removed))


def _leftovers(sm: Any, endpoint_name: str) -> tuple[list[str], list[str]]:
    """Endpoint configurations and models tagged for this endpoint that no endpoint uses (failed runs)."""
    prefix = endpoint_name[:43].rstrip("-")
    configs = [
        c["EndpointConfigName"]
        for page in sm.get_paginator("list_endpoint_configs").paginate(NameContains=prefix)
        for c in page["EndpointConfigs"]
        if _managed(sm, c["EndpointConfigArn"], endpoint_name)
    ]
    models = [
        m["ModelName"]
        for page in sm.get_paginator("list_models").paginate(NameContains=prefix)
        for m in page["Models"]
        if _managed(sm, m["ModelArn"], endpoint_name)
    ]
    return configs, models


def delete_endpoint(
    aws: Aws,
    name: str,
    *,
    force: bool = False,
    progress: Progress = _quiet,
    poll_s: float = 30.0,
    timeout_s: float = 1800.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Delete the endpoint, its auto-scaling, configuration and models, and any leftovers of failed runs.

    Only resources tagged ``smtriton:endpoint=<name>`` are deleted, unless ``force``. Returns what was removed.
    """
    sm = aws.sagemaker
    removed: list[str] = []
    existing = describe_endpoint(sm, name)
    if existing is not None:
        if not force and not _managed(sm, existing["EndpointArn"], name):
            raise DeployError(f"endpoint {name} was not created by smtriton; pass force to delete it anyway")
        if _deregister_scaling(aws.autoscaling, name, progress):
            removed.append(f"scalable-target/{_scaling_resource(name)}")
        sm.delete_endpoint(EndpointName=name)
        progress(f"deleting endpoint {name}")
        _Waiting(progress, poll_s, timeout_s, sleep, clock).endpoint(sm, name, "endpoint_deleted")
        removed.append(f"endpoint/{name}")
        removed += _delete_config_and_models(sm, existing["EndpointConfigName"], name, force, progress)
    configs, models = _leftovers(sm, name)
    for config in configs:
        sm.delete_endpoint_config(EndpointConfigName=config)
        removed.append(f"endpoint-config/{config}")
        progress(f"deleted endpoint configuration {config}")
    for model in models:
        sm.delete_model(ModelName=model)
        removed.append(f"model/{model}")
        progress(f"deleted model {model}")
    return removed
