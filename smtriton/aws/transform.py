"""Batch transform: the serving image run over S3 input by a SageMaker transform job.

One call creates a model of the image and the model data, and the job (tagged
``smtriton:transform-job=<job>``), with the AMI version a GPU instance type needs; with ``wait`` it
shows the job's status until it ends, prints its ``FailureReason`` in one line when it fails, and
deletes the model the job no longer needs. The container side (``/execution-parameters``, the limits
``SAGEMAKER_BATCH`` sets) is serve's: a body is one KServe v2 request, or with ``Line`` splitting a
mini-batch of lines (JSON Lines, one request a line, or CSV rows) answered a line a record, so that
``MultiRecord`` (serve's ``/execution-parameters`` answer) packs as many lines as fit ``MaxPayloadInMB``
in one request. The job's records, strategy and limits are :mod:`smtriton.aws.batch_job`'s, which
`smtriton local-transform` runs here: a strategy not given is left out, for the container's
``/execution-parameters`` to decide. Arguments are checked before anything asks AWS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from smtriton.aws import ami
from smtriton.aws.batch_job import DEFAULT_CONTENT_TYPE, DEFAULT_INSTANCE_TYPE, DEFAULT_SPLIT_TYPE, BatchJob
from smtriton.aws.hosting import Hosting
from smtriton.aws.model import ServingModel, is_s3
from smtriton.aws.resources import DeployError, WaitTimeout, check_name, described_or_none, resource_name, tags
from smtriton.aws.waiting import Poller

Progress = Callable[[str], None]

JOB_TAG = "smtriton:transform-job"


@dataclass(frozen=True)
class TransformSpec:
    """``input``: an S3 prefix (every object under it) or one object; each record (a whole object, or a
    line with ``split_type="Line"``) is one request of ``content_type``."""

    name: str
    image: str
    role_arn: str
    model_data: str | None
    input: str
    output: str
    content_type: str = DEFAULT_CONTENT_TYPE
    split_type: str = DEFAULT_SPLIT_TYPE
    batch_strategy: str | None = None  # None: left out, the container's /execution-parameters decides
    accept: str | None = None
    max_payload_mb: int | None = None
    max_concurrent: int | None = None
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    ami_version: str | None = None  # default: the newest GPU AMI on a GPU instance type
    environment: Mapping[str, str] = field(default_factory=dict)
    default_model: str | None = None
    hosting: Hosting = field(default_factory=Hosting)
    tags: Mapping[str, str] = field(default_factory=dict)

    def model(self) -> ServingModel:
        return ServingModel(self.image, self.role_arn, self.model_data, False, self.environment, self.default_model,
                            hosting=self.hosting)  # fmt: skip

    def validate(self) -> list[str]:
        check_name(self.name, "transform job name")
        warnings = self.model().check()
        self.hosting.check()
        if self.hosting.volume_size_gb is not None or self.hosting.model_download_timeout_s is not None:
            raise DeployError("a transform job takes neither a volume size nor a model download timeout")
        for what, url in (("input", self.input), ("output", self.output)):
            if not is_s3(url):
                raise DeployError(f"the transform {what} {url!r} must be an s3:// location")
        if not self.instance_type.startswith("ml.") or self.instance_count < 1:
            raise DeployError("a transform job needs an instance type (ml.*) and at least one instance")
        warnings.extend(self.job.check())
        ami.choose("transform", self.instance_type, self.ami_version)
        if (note := ami.warning("transform", self.instance_type)) is not None:
            warnings.append(note)
        return warnings

    @property
    def job(self) -> BatchJob:
        """The job's records, strategy and limits, as `smtriton local-transform` runs them."""
        return BatchJob(self.content_type, self.accept, self.split_type, self.batch_strategy, self.max_payload_mb,
                        self.max_concurrent, self.instance_type, self.hosting.kms_key)  # fmt: skip

    def job_tags(self) -> list[dict[str, str]]:
        return tags(JOB_TAG, self.name, self.tags)

    def request(self, model_name: str) -> dict[str, Any]:
        """The CreateTransformJob request."""
        transform_input: dict[str, Any] = {  # S3Prefix: every object whose key starts so (one object too)
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": self.input}},
            "ContentType": self.content_type,
            "SplitType": self.split_type,
        }
        output: dict[str, Any] = {"S3OutputPath": self.output, "AssembleWith": self.split_type}
        if self.accept:
            output["Accept"] = self.accept
        resources: dict[str, Any] = {"InstanceType": self.instance_type, "InstanceCount": self.instance_count}
        if self.hosting.kms_key:
            output["KmsKeyId"] = self.hosting.kms_key
        if self.job.volume_kms_key:
            resources["VolumeKmsKeyId"] = self.job.volume_kms_key
        version = ami.choose("transform", self.instance_type, self.ami_version)
        if version:
            resources["TransformAmiVersion"] = version
        request: dict[str, Any] = {
            "TransformJobName": self.name,
            "ModelName": model_name,
            "TransformInput": transform_input,
            "TransformOutput": output,
            "TransformResources": resources,
            "Tags": self.job_tags(),
        }
        if self.batch_strategy is not None:
            request["BatchStrategy"] = self.batch_strategy
        if self.max_payload_mb is not None:
            request["MaxPayloadInMB"] = self.max_payload_mb
        if self.max_concurrent is not None:
            request["MaxConcurrentTransforms"] = self.max_concurrent
        return request


def _describe(sm: Any, name: str) -> dict[str, Any] | None:
    return described_or_none(sm.describe_transform_job, TransformJobName=name)


@dataclass(frozen=True)
class TransformResult:
    name: str
    arn: str
    model_name: str
    status: str  # InProgress when not waited for, else Completed


def run_transform(
    sm: Any,
    spec: TransformSpec,
    *,
    wait: bool = False,
    progress: Progress = lambda _: None,
    poll_s: float = 30.0,
    timeout_s: float = 24 * 3600.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> TransformResult:
    """Create the model and the job; with ``wait``, follow the job to its end and delete the model."""
    for warning in spec.validate():
        progress(f"warning: {warning}")
    model_name = resource_name(spec.name)
    sm.create_model(**spec.model().request(model_name, spec.job_tags()))
    progress(f"created model {model_name}")
    try:
        arn = sm.create_transform_job(**spec.request(model_name))["TransformJobArn"]
    except Exception:
        sm.delete_model(ModelName=model_name)
        raise
    progress(f"created transform job {spec.name}")
    if not wait:
        return TransformResult(spec.name, arn, model_name, "InProgress")
    poller = Poller(progress, poll_s, timeout_s, sleep, clock)
    try:
        poller.until(
            f"transform job {spec.name}",
            lambda: _describe(sm, spec.name),
            status_key="TransformJobStatus",
            done={"Completed"},
            failed={"Failed", "Stopped"},
            reason=lambda d: (
                d.get("FailureReason") or ("stopped" if d.get("TransformJobStatus") == "Stopped" else None)
            ),
            hint=f" (the model {model_name} stays until it ends)",
        )
    except WaitTimeout:
        raise
    except DeployError:
        sm.delete_model(ModelName=model_name)
        progress(f"deleted model {model_name}")
        raise
    sm.delete_model(ModelName=model_name)
    progress(f"deleted model {model_name}")
    return TransformResult(spec.name, arn, model_name, "Completed")
