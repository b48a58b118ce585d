"""Building the serving image: the exact `docker` command lines, run through an injectable runner.

Nothing here talks to a Docker engine directly: every call goes through a :class:`Runner` (by default
:class:`SubprocessRunner`), so the argv that would run can be checked without an engine.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from smtriton.errors import ToolError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = PROJECT_ROOT / "Dockerfile"

Target = Literal["triton", "cpu"]
TARGETS: tuple[Target, ...] = ("triton", "cpu")

NGC_TRITON = "nvcr.io/nvidia/tritonserver"
# The Triton release the Dockerfile pins by default (NVIDIA's and AWS's images share the numbering).
DEFAULT_TRITON_RELEASE = "25.04"
# AWS publishes its SageMaker Triton image (sagemaker-tritonserver:<YY.MM>-py3) from these accounts;
# every other commercial region uses DLC_ACCOUNT (aws/sagemaker-python-sdk, image_uri_config).
DLC_ACCOUNT = "763104351884"
SAGEMAKER_TRITON_ACCOUNTS = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-northeast-3": "364406365360",
    "ap-southeast-3": "907027046896",
    "ca-west-1": "204538143572",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
    "eu-south-1": "692866216735",
    "il-central-1": "780543022126",
    "me-south-1": "217643126080",
}
ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
LABEL_BASE = "org.opencontainers.image.base.name"


class DockerError(ToolError, RuntimeError):
    """A docker command failed, or docker (with buildx) is not usable here."""


class Runner(Protocol):
    """Runs one docker command line; returns its stdout when ``capture`` is set."""

    def __call__(self, argv: Sequence[str], *, input: bytes | None = None, capture: bool = False) -> str: ...


class SubprocessRunner:
    """Run commands for real; output goes to the terminal unless captured."""

    def __call__(self, argv: Sequence[str], *, input: bytes | None = None, capture: bool = False) -> str:
        try:
            done = subprocess.run(list(argv), input=input, capture_output=capture, check=False)
        except FileNotFoundError:
            raise DockerError(f"{argv[0]} not found: install Docker (with the buildx plugin)") from None
        if done.returncode != 0:
            detail = (done.stderr or b"").decode(errors="replace").strip() if capture else ""
            raise DockerError(f"`{' '.join(argv[:3])} ...` failed with exit code {done.returncode}. {detail}".strip())
        return (done.stdout or b"").decode(errors="replace") if capture else ""


@dataclass
class RecordingRunner:
    """A runner that runs nothing: records each argv (and stdin) and answers from ``outputs``."""

    outputs: Mapping[tuple[str, ...], str] = field(default_factory=dict)
    calls: list[tuple[list[str], bytes | None]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], *, input: bytes | None = None, capture: bool = False) -> str:
        self.calls.append((list(argv), input))
        for prefix, output in self.outputs.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return output
        return ""

    @property
    def argvs(self) -> list[list[str]]:
        return [argv for argv, _ in self.calls]


@dataclass(frozen=True)
class BuildSpec:
    """What to build: the image name, the Dockerfile target and its build arguments."""

    tag: str = "smtriton:latest"
    target: Target = "triton"
    base_image: str | None = None  # BASE_IMAGE (triton target) or CPU_BASE_IMAGE (cpu target)
    platform: str | None = "linux/amd64"  # SageMaker instances are amd64 (Graviton: linux/arm64)
    build_args: Mapping[str, str] = field(default_factory=dict)
    context: Path = PROJECT_ROOT
    dockerfile: Path | None = None
    pull: bool = False
    no_cache: bool = False


def ngc_triton_image(release: str = DEFAULT_TRITON_RELEASE) -> str:
    return f"{NGC_TRITON}:{release}-py3"


def sagemaker_triton_image(region: str, release: str = DEFAULT_TRITON_RELEASE) -> str:
    """AWS's SageMaker Triton image for a region (the base AWS requires for GPU multi-model endpoints)."""
    account = SAGEMAKER_TRITON_ACCOUNTS.get(region, DLC_ACCOUNT)
    suffix = ".amazonaws.com.cn" if region.startswith("cn-") else ".amazonaws.com"
    return f"{account}.dkr.ecr.{region}{suffix}/sagemaker-tritonserver:{release}-py3"


def is_sagemaker_triton_image(image: str) -> bool:
    """True for AWS's ``<account>.dkr.ecr.<region>.amazonaws.com/sagemaker-tritonserver:...`` images."""
    host, _, rest = image.partition("/")
    return bool(ECR_HOST.match(host)) and rest.split(":", 1)[0].split("@", 1)[0] == "sagemaker-tritonserver"


def ecr_registry_of(image: str) -> tuple[str, str, str] | None:
    """(host, account, region) when ``image`` lives in an Amazon ECR registry, else None."""
    host = image.partition("/")[0]
    m = ECR_HOST.match(host)
    return (host, m["account"], m["region"]) if m else None


def build_argv(spec: BuildSpec, docker: str = "docker") -> list[str]:
    """The `docker buildx build` command line for ``spec``.

    ``--load`` puts the result in the local image store (for `docker push` and `docker run`), and
    ``--provenance=false`` keeps buildx from wrapping the image in an attestation index, which
    SageMaker's CreateModel does not accept as a container image.
    """
    if spec.target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {spec.target!r}")
    argv = [docker, "buildx", "build", "--load", "--provenance=false"]
    argv += ["--file", str(spec.dockerfile or spec.context / "Dockerfile")]
    argv += ["--target", spec.target, "--tag", spec.tag]
    if spec.platform:
        argv += ["--platform", spec.platform]
    args = dict(spec.build_args)
    if spec.base_image:
        args["BASE_IMAGE" if spec.target == "triton" else "CPU_BASE_IMAGE"] = spec.base_image
    for key in sorted(args):
        argv += ["--build-arg", f"{key}={args[key]}"]
    if spec.pull:
        argv.append("--pull")
    if spec.no_cache:
        argv.append("--no-cache")
    argv.append(str(spec.context))
    return argv


def check_buildx(runner: Runner, docker: str = "docker") -> None:
    """The Dockerfile needs BuildKit (RUN --mount): fail early and clearly without the buildx plugin."""
    try:
        runner([docker, "buildx", "version"], capture=True)
    except DockerError as exc:
        raise DockerError(f"docker buildx is needed to build this image (RUN --mount): {exc}") from None


def build_image(spec: BuildSpec, runner: Runner, docker: str = "docker") -> str:
    """Build the image; returns its local tag."""
    check_buildx(runner, docker)
    runner(build_argv(spec, docker))
    return spec.tag


def login_argv(registry: str, username: str, docker: str = "docker") -> list[str]:
    """`docker login` reading the password from stdin (never on the command line)."""
    return [docker, "login", "--username", username, "--password-stdin", registry]


def docker_login(runner: Runner, registry: str, username: str, password: str, docker: str = "docker") -> None:
    runner(login_argv(registry, username, docker), input=password.encode(), capture=True)


def tag_argv(source: str, target: str, docker: str = "docker") -> list[str]:
    return [docker, "tag", source, target]


def push_argv(image: str, docker: str = "docker") -> list[str]:
    return [docker, "push", image]


def image_labels(runner: Runner, image: str, docker: str = "docker") -> dict[str, str] | None:
    """The labels of a locally present image, or None when docker cannot tell (image absent, no docker)."""
    import json

    try:
        out = runner([docker, "image", "inspect", "--format", "{{json .Config.Labels}}", image], capture=True)
    except DockerError:
        return None
    try:
        labels = json.loads(out.strip() or "null")
    except ValueError:
        return None
    return dict(labels) if isinstance(labels, dict) else {}
