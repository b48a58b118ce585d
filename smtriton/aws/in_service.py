"""What an endpoint runs now, read before an update, and whether an update would change it.

A variant keeps the instances it runs now unless ``--instance-count`` is given, and an auto-scaled one
even then (:func:`instance_count`); an update that would change nothing (same requests, the image tag
still naming the digest that serves, the model archive's ETag the one recorded at deploy time:
:func:`differences`) is not made.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from smtriton.aws import scaling
from smtriton.aws.endpoint_spec import DATA_ETAG_TAG, EndpointSpec
from smtriton.aws.resources import described_or_none, error_code, error_text, is_access_denied

Progress = Callable[[str], None]


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
class Current:
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


def read_current(sm: Any, aas: Any, existing: Mapping[str, Any], progress: Progress) -> Current:
    config = sm.describe_endpoint_config(EndpointConfigName=existing["EndpointConfigName"])
    model_name = (config.get("ProductionVariants") or [{}])[0].get("ModelName")
    model = described_or_none(sm.describe_model, ModelName=model_name) if model_name else None
    snapshot = read_scaling(aas, existing["EndpointName"], progress, "updating it")
    return Current(existing, config, model, snapshot)


def instance_count(spec: EndpointSpec, current: Current | None, progress: Progress) -> int:
    """The instances the new configuration asks for. An auto-scaled variant keeps the instances it runs
    now (within the limits it will have), unless its instance type changes: a redeploy must not drop a
    scaled-out endpoint to ``--instance-count``. Any other instance-based variant keeps what it runs now
    unless ``--instance-count`` is given: an image update must not cut its capacity."""
    if current is None or spec.serverless is not None or current.instances is None:
        return spec.count
    if not current.variant.get("InstanceType"):  # serverless now: it runs no instances of its own
        return spec.count
    scaled = current.scaling is not None and not spec.remove_autoscaling
    if scaled and current.variant.get("InstanceType") == spec.instance_type:
        assert current.scaling is not None
        low, high = (
            (spec.autoscaling.min_capacity, spec.autoscaling.max_capacity)
            if spec.autoscaling
            else current.scaling.limits
        )
        count = min(max(current.instances, low, 1), high)
        if count != spec.count:
            progress(
                f"keeping {count} instances: the endpoint is auto-scaled (--instance-count {spec.count} "
                "applies to a new endpoint or a new instance type)"
            )
        return count
    if scaled or spec.instance_count is not None:
        return spec.count
    count = max(current.instances, 1)
    if count != spec.count:
        progress(f"keeping {count} instances: the endpoint runs {count} now (--instance-count changes it)")
    return count


def data_etag(s3: Any, url: str | None, progress: Progress) -> str | None:
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


def differences(
    sm: Any, ecr: Any, spec: EndpointSpec, current: Current, model: Mapping[str, Any], config: Mapping[str, Any]
) -> str | None:
    """What an update would change, in a few words; None when it would change nothing."""
    if current.model is None:
        return "the model in service is gone"
    change = _model_difference(current.model, model)
    if change is not None:
        return change
    keep_count = current.scaling is not None or spec.instance_count is None  # the count it runs, not the config's
    ours, theirs = config["ProductionVariants"][0], current.variant
    for key in _VARIANT_KEYS:
        if key == "InitialInstanceCount" and keep_count:
            continue
        if theirs.get(key) != ours.get(key):
            return f"another {key}"
    for key in _CONFIG_KEYS:
        if current.config.get(key) != config.get(key):
            return f"another {key}"
    if not _same_image(ecr, spec.image, current.endpoint):
        return "the image may have changed (its tag is not proven to name the digest in service)"
    if spec.model_data and spec.model_data.endswith(".tar.gz") and not spec.multi_model:
        wanted = next((t["Value"] for t in model["Tags"] if t["Key"] == DATA_ETAG_TAG), None)
        recorded = _model_tag(sm, current.model["ModelArn"], DATA_ETAG_TAG)
        if wanted is None or wanted != recorded:
            return "the model archive may have changed (its ETag is not the one in service)"
    elif spec.model_data and not spec.multi_model:
        return "an uncompressed model prefix, whose content cannot be compared"
    return None


def _model_difference(described: Mapping[str, Any], model: Mapping[str, Any]) -> str | None:
    """What differs between the model in service (as described) and the CreateModel request."""
    if described.get("ExecutionRoleArn") != model["ExecutionRoleArn"]:
        return "another execution role"
    if described.get("VpcConfig") != model.get("VpcConfig"):
        return "another VPC"
    if bool(described.get("EnableNetworkIsolation")) != bool(model.get("EnableNetworkIsolation")):
        return "another network isolation"
    container = described.get("PrimaryContainer", {})
    for key in _CONTAINER_KEYS:
        if (container.get(key) or None) != (model["PrimaryContainer"].get(key) or None):
            return f"another {key}"
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
