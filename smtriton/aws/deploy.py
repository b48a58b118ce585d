"""Deploy the serving image to SageMaker: single-model (SME) and multi-model (MME) endpoints.

One call creates — or updates in place — a model, an endpoint configuration and an endpoint, waits
while printing the status, and optionally attaches auto-scaling (:mod:`smtriton.aws.scaling`).
Everything it creates carries the tag ``smtriton:endpoint=<endpoint name>``, and :func:`delete_endpoint`
removes exactly what carries it, so nothing is left behind: a failed create is rolled back, and an
update deletes the configuration and model it replaced.

An update keeps what the endpoint has become since it was deployed (:mod:`smtriton.aws.in_service`):
a variant keeps the instances it runs now unless a count is given (an auto-scaled one even then, on the
same instance type), and its scaling registration, which is removed only when asked and put back when
SageMaker rolls the update back; an update that would change nothing is not made. What an endpoint is
and the requests it becomes are :mod:`smtriton.aws.endpoint_spec`'s, re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from smtriton.aws import components, scaling
from smtriton.aws.ami import is_gpu_instance
from smtriton.aws.capture import DataCapture
from smtriton.aws.components import Component
from smtriton.aws.endpoint_spec import (
    AsyncInference,
    EndpointSpec,
    Serverless,
    endpoint_config_request,
    model_request,
    validate,
)
from smtriton.aws.hosting import Hosting
from smtriton.aws.in_service import Current, data_etag, differences, instance_count, read_current, read_scaling
from smtriton.aws.resources import (
    MANAGED_TAG,
    NAME_RE,
    DeployError,
    WaitTimeout,
    described_or_none,
    is_managed,
    is_not_found,
    name_prefix,
    resource_name,
    tags,
)
from smtriton.aws.scaling import AutoScaling
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


def _quiet(_: str) -> None:
    pass


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
        current = read_current(sm, aws.autoscaling, existing, progress)

    model_name = resource_name(spec.name)
    config_name = model_name
    model = model_request(spec, model_name, data_etag(aws.s3, spec.model_data, progress))
    config = endpoint_config_request(spec, config_name, model_name, instance_count(spec, current, progress))
    if current is not None:
        change = differences(sm, aws.ecr, spec, current, model, config)
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
        _refuse_endpoint_changes(spec, variants[0] if variants else {})
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


def _refuse_endpoint_changes(spec: EndpointSpec, variant: Mapping[str, Any]) -> None:
    """An inference component added to an existing endpoint leaves the endpoint as it is: an option of
    the endpoint asked for that it does not run already is refused, named, before anything is made."""
    changes = []
    runs = variant.get("InitialInstanceCount")
    if spec.instance_count is not None and spec.instance_count != runs:
        changes.append(f"--instance-count {spec.instance_count} (it started {runs} instances)")
    runs = variant.get("InferenceAmiVersion")
    if spec.ami_version is not None and spec.ami_version != runs:
        changes.append(f"--inference-ami-version {spec.ami_version} (it runs {runs or 'the default AMI'})")
    if spec.autoscaling is not None:
        scaling = variant.get("ManagedInstanceScaling") or {}
        on = scaling.get("Status") == "ENABLED"
        low, high = (scaling.get("MinInstanceCount"), scaling.get("MaxInstanceCount")) if on else (None, None)
        if (low, high) != (spec.autoscaling.min_capacity, spec.autoscaling.max_capacity):
            now = f"scales {low}-{high} instances" if on else "has no managed instance scaling"
            changes.append(
                f"--autoscale-min {spec.autoscaling.min_capacity} --autoscale-max {spec.autoscaling.max_capacity} "
                f"(it {now})"
            )
    if changes:
        raise DeployError(
            f"endpoint {spec.name} exists, and an inference component added to it leaves it as it is: "
            f"{', '.join(changes)} would change it; leave {'them' if len(changes) > 1 else 'it'} out, or delete "
            "the endpoint and deploy again"
        )


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


def _unchanged(aws: Aws, spec: EndpointSpec, current: Current, progress: Progress) -> DeployResult:
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
    current: Current,
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
