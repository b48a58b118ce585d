"""The Amazon Machine Image a GPU instance runs: the one place smtriton picks an AMI version.

SageMaker offers AMI versions per kind of job, each with its NVIDIA driver; botocore's service model
documents them (``TransformResources.TransformAmiVersion`` for batch transform,
``ProductionVariant.InferenceAmiVersion`` for endpoints). They are read from there, so a newer
botocore brings newer AMIs without a change here. By default a GPU instance type gets the version with
the newest driver (an image's CUDA runs on a newer driver, not on an older one); CPU types get none,
and asking for one there is refused. A botocore from before these members (InferenceAmiVersion came in
1.34.122, TransformAmiVersion in 1.37.23) offers none: a GPU type then runs SageMaker's default AMI,
said in one warning, and asking for one is refused with the version to upgrade to.

A GPU instance type is told by its family (``ml.<family>.<size>``): the P and G families, NVIDIA's GPUs,
however their name goes on (``p4de``, ``g6e``, ``p6-b200``, ``p6e-gb200``); a unit test classifies
every type in botocore's enums, so a family spelled in a new way fails it instead of passing for a CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from smtriton.aws.resources import DeployError

GPU_INSTANCE_RE = re.compile(r"^ml\.[pg]\d+[a-z0-9-]*\.")
# Where each kind of deployment takes its AMI version in SageMaker's API: (structure, member), and the
# first botocore (and boto3) release whose model has that member.
MEMBERS = {"transform": ("TransformResources", "TransformAmiVersion"),
           "endpoint": ("ProductionVariant", "InferenceAmiVersion")}  # fmt: skip
FIRST_BOTOCORE = {"transform": "1.37.23", "endpoint": "1.34.122"}
_ENTRY = re.compile(r"<dt>\s*([a-z0-9-]+)\s*</dt>\s*<dd>(.*?)</dd>", re.S)
_DRIVER = re.compile(r"NVIDIA driver version:\s*(\d+)")


@dataclass(frozen=True)
class AmiVersion:
    name: str
    driver: int | None  # the NVIDIA driver's major version; None for other accelerators


def is_gpu_instance(instance_type: str | None) -> bool:
    return bool(instance_type and GPU_INSTANCE_RE.match(instance_type))


@cache
def versions(kind: str) -> tuple[AmiVersion, ...]:
    """The AMI versions botocore's SageMaker model documents for ``kind`` (``transform`` or ``endpoint``)."""
    import botocore.session

    structure, member = MEMBERS[kind]
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.shape_for(structure).members.get(member)
    if shape is None:  # a botocore older than the member: see unknown_to_botocore
        return ()
    docs = shape.documentation
    found = []
    for name, body in _ENTRY.findall(docs):
        driver = _DRIVER.search(body)
        found.append(AmiVersion(name, int(driver.group(1)) if driver else None))
    return tuple(found)


@cache
def unknown_to_botocore(kind: str) -> str | None:
    """Why this botocore offers no AMI version for ``kind`` (a release from before the member); None
    when it knows the member."""
    import botocore
    import botocore.session

    structure, member = MEMBERS[kind]
    model = botocore.session.get_session().get_service_model("sagemaker")
    if member in model.shape_for(structure).members:
        return None
    return f"botocore {botocore.__version__} predates {member} (boto3 {FIRST_BOTOCORE[kind]} or newer has it)"


def warning(kind: str, instance_type: str | None) -> str | None:
    """The one line a GPU deployment gets when this botocore cannot ask for an AMI version."""
    why = unknown_to_botocore(kind)
    if why is None or not is_gpu_instance(instance_type):
        return None
    default = f"{instance_type} runs SageMaker's default AMI, whose NVIDIA driver may be older than the image's CUDA"
    return f"{why}: {default}"


def choose(kind: str, instance_type: str | None, requested: str | None = None) -> str | None:
    """The AMI version to ask for: ``requested`` when it is one SageMaker offers a GPU type, else the
    GPU version with the newest driver on a GPU type, none on a CPU type (nor with a botocore that
    predates the member)."""
    offered = versions(kind)
    gpu = [v for v in offered if v.driver is not None]
    if requested is not None:
        if not is_gpu_instance(instance_type):
            raise DeployError(f"an AMI version is for GPU instance types; {instance_type} has no GPU")
        why = unknown_to_botocore(kind)
        if why is not None:
            raise DeployError(f"cannot ask for AMI version {requested!r}: {why}; upgrade boto3")
        if requested not in {v.name for v in gpu}:
            names = ", ".join(v.name for v in gpu) or "none known to this botocore"
            raise DeployError(f"AMI version {requested!r} is not one SageMaker offers here ({names})")
        return requested
    if not is_gpu_instance(instance_type) or not gpu:
        return None
    return max(gpu, key=lambda v: v.driver or 0).name
