"""One batch transform job, as `smtriton transform` asks SageMaker for it and `smtriton local-transform`
runs it here: one set of defaults, one check of what CreateTransformJob refuses, one resolution of what
the job leaves to the container.

The defaults are SageMaker's own: ``SplitType=None`` (an object is one request), and no
``BatchStrategy``, ``MaxPayloadInMB`` or ``MaxConcurrentTransforms`` unless given; SageMaker then takes
the container's ``GET /execution-parameters`` answer, else its own defaults (6 MB, 1, one record a
request). CreateTransformJob's limits are checked before anything is made (a refusal there would come
only after the model is created): MaxPayloadInMB 0-100 and MaxConcurrentTransforms * MaxPayloadInMB at
most 100, an instance type botocore's ``TransformInstanceType`` lists, and no volume KMS key on an
instance type whose storage is local NVMe (the key then encrypts the output only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from smtriton.aws.hosting import Hosting
from smtriton.aws.resources import DeployError

MIB = 1024 * 1024
DEFAULT_CONTENT_TYPE = "application/json"
DEFAULT_SPLIT_TYPE = "None"  # SageMaker's: an object is one request
DEFAULT_INSTANCE_TYPE = "ml.g5.xlarge"
SPLIT_TYPES = ("None", "Line")
# SageMaker's record formats serve cannot read a record of.
BINARY_SPLIT_TYPES = ("RecordIO", "TFRecord")
BATCH_STRATEGIES = ("SingleRecord", "MultiRecord")
# Bodies that are no lines of text: one request a body, never split by line.
WHOLE_BODY_TYPES = ("application/vnd.sagemaker-triton.binary+json", "image/jpeg", "image/png", "application/x-image")
MAX_PAYLOAD_MB = 100  # SageMaker's limit for MaxPayloadInMB, and for MaxConcurrentTransforms * MaxPayloadInMB
# SageMaker's own settings when neither the job nor the container's /execution-parameters gives them.
DEFAULT_PAYLOAD_MB = 6
DEFAULT_CONCURRENCY = 1
DEFAULT_STRATEGY = "SingleRecord"
# /execution-parameters' (and the container variables') words for the strategies.
CONTAINER_STRATEGIES = {"MULTI_RECORD": "MultiRecord", "SINGLE_RECORD": "SingleRecord"}
# Instance families whose storage is local NVMe, encrypted by the instance: SageMaker refuses a
# VolumeKmsKeyId there (g4dn, p3dn, p4d, c5d...: a "d" in the family; g5, g6, g6e, gr6, p5, p6, trn1).
_LOCAL_STORAGE = re.compile(r"^ml\.(?:[a-z]+\d+[a-z]*d[a-z]?|g5|g6e?|gr6|p5[a-z]*|p6[a-z0-9-]*|trn\d+n?)\.")


def is_local_storage(instance_type: str) -> bool:
    """Whether the instance type's storage is local NVMe (no volume KMS key there)."""
    return bool(_LOCAL_STORAGE.match(instance_type))


@cache
def transform_instance_types() -> tuple[str, ...]:
    """The instance types botocore's SageMaker model lists for transform jobs (none: not checked)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for("TransformInstanceType").enum)


def _families(types: tuple[str, ...]) -> str:
    families = dict.fromkeys(t.rsplit(".", 1)[0] for t in types if re.match(r"^ml\.[gp]\d", t))
    return ", ".join(f"{f}.*" for f in families)


def media(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


def check_records(split_type: str, batch_strategy: str | None, content_type: str) -> None:
    """Refuse (one line) the splitting and batching serve cannot answer: RecordIO and TFRecord records,
    lines of a body that has none."""
    if split_type in BINARY_SPLIT_TYPES:
        raise DeployError(
            f"{split_type} splitting sends binary records, and serve reads a body as one KServe v2 request "
            "(JSON or binary+json) or as lines (JSON Lines, CSV): use Line with JSON Lines or CSV, or None"
        )
    if split_type not in SPLIT_TYPES:
        raise DeployError(f"split type must be one of {', '.join(SPLIT_TYPES)}, not {split_type!r}")
    if batch_strategy is not None and batch_strategy not in BATCH_STRATEGIES:
        raise DeployError(f"batch strategy must be one of {', '.join(BATCH_STRATEGIES)}, not {batch_strategy!r}")
    kind = media(content_type)
    if split_type == "Line" and kind in WHOLE_BODY_TYPES:
        raise DeployError(f"{kind} bodies are no lines of text: use --split-type None (one request an object)")


@dataclass(frozen=True)
class Plan:
    """How the job runs, settled: ``payload_bytes`` None for no limit (``MaxPayloadInMB`` 0)."""

    strategy: str
    payload_bytes: int | None
    concurrency: int


def _whole(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


@dataclass(frozen=True)
class BatchJob:
    """What a CreateTransformJob request says of its records and instances (None: not given, the
    container's answer decides). ``kms_key``: the output's key, and the volume's where it has one."""

    content_type: str = DEFAULT_CONTENT_TYPE
    accept: str | None = None
    split_type: str = DEFAULT_SPLIT_TYPE
    batch_strategy: str | None = None
    max_payload_mb: int | None = None
    max_concurrent: int | None = None
    instance_type: str = DEFAULT_INSTANCE_TYPE
    kms_key: str | None = None

    def check(self) -> list[str]:
        """Raise DeployError (one line) for what CreateTransformJob would refuse; the warnings to show."""
        check_records(self.split_type, self.batch_strategy, self.content_type)
        Hosting(kms_key=self.kms_key).check()
        payload, concurrent = self.max_payload_mb, self.max_concurrent
        if payload is not None and not 0 <= payload <= MAX_PAYLOAD_MB:
            raise DeployError(f"the maximum payload must be 0-{MAX_PAYLOAD_MB} MB")
        if concurrent is not None and concurrent < 1:
            raise DeployError("the maximum of concurrent transforms must be at least 1")
        if payload is not None and concurrent is not None and concurrent * payload > MAX_PAYLOAD_MB:
            raise DeployError(
                f"MaxConcurrentTransforms * MaxPayloadInMB is {concurrent} * {payload} = {concurrent * payload}, "
                f"and SageMaker takes at most {MAX_PAYLOAD_MB}: lower --max-concurrent or --max-payload-mb"
            )
        offered = transform_instance_types()
        if offered and self.instance_type not in offered:
            import botocore

            raise DeployError(
                f"{self.instance_type} is not an instance type batch transform runs on (botocore "
                f"{botocore.__version__}'s TransformInstanceType; its GPU types: {_families(offered)})"
            )
        if self.kms_key is not None and is_local_storage(self.instance_type):
            return [
                f"{self.instance_type} stores on local NVMe, which its hardware encrypts and SageMaker takes no "
                "volume KMS key for: --kms-key encrypts the job's output only"
            ]
        return []

    @property
    def volume_kms_key(self) -> str | None:
        """The TransformResources' VolumeKmsKeyId: none on local NVMe storage."""
        return None if is_local_storage(self.instance_type) else self.kms_key

    def environment(self) -> dict[str, str]:
        """The variables SageMaker sets in the container for this job (only those the job gives)."""
        env = {"SAGEMAKER_BATCH": "true"}
        if self.batch_strategy is not None:
            env["SAGEMAKER_BATCH_STRATEGY"] = next(
                k for k, v in CONTAINER_STRATEGIES.items() if v == self.batch_strategy
            )
        if self.max_payload_mb is not None:
            env["SAGEMAKER_MAX_PAYLOAD_IN_MB"] = str(self.max_payload_mb)
        if self.max_concurrent is not None:
            env["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"] = str(self.max_concurrent)
        return env

    def settle(self, container: dict[str, object] | None) -> Plan:
        """SageMaker's order: the job's settings, then the container's answer, then SageMaker's defaults."""
        answered = container or {}
        strategy = self.batch_strategy or CONTAINER_STRATEGIES.get(str(answered.get("BatchStrategy")), DEFAULT_STRATEGY)
        payload_mb = self.max_payload_mb
        if payload_mb is None:
            payload_mb = _whole(answered.get("MaxPayloadInMB"), DEFAULT_PAYLOAD_MB)
        concurrency = self.max_concurrent or _whole(answered.get("MaxConcurrentTransforms"), DEFAULT_CONCURRENCY)
        return Plan(strategy, payload_mb * MIB if payload_mb > 0 else None, max(1, concurrency))
