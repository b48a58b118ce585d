"""`smtriton build-image | push-image`, and what every AWS command shares: its messages, its KEY=VALUE
options, its boto3 session. The endpoint's commands are :mod:`smtriton.aws.endpoint_cli`'s, invoking and
reading captured data :mod:`smtriton.aws.invoke_cli`'s.

AWS credentials, region and account come from the standard boto3 chain (environment, profile, role);
``AWS_ENDPOINT_URL`` (boto3's own setting) points every client at another endpoint, e.g. a local stack.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from smtriton.aws.docker_image import TARGETS, BuildSpec, SubprocessRunner
from smtriton.cli_options import ProfileOpt, RegionOpt
from smtriton.errors import ToolError

console = Console(stderr=True)

TargetOpt = Annotated[str, typer.Option(help=f"Dockerfile target: {' or '.join(TARGETS)} (CPU-only, no NGC image)")]
BaseOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
    typer.Option(
        help="Base image: BASE_IMAGE of the triton target (NVIDIA's nvcr.io/nvidia/tritonserver:<YY.MM>-py3 by "
        "default; <account>.dkr.ecr.<region>.amazonaws.com/sagemaker-tritonserver:<YY.MM>-py3 for GPU "
        "multi-model endpoints), or CPU_BASE_IMAGE of the cpu target"
    ),
]
PlatformOpt = Annotated[str, typer.Option(help="Target platform ('' for the builder's own)")]
BuildArgOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--build-arg", metavar="KEY=VALUE", help="Passed to docker build (repeatable), e.g. TORCH_VERSION=2.13.0"
    ),
]


def say(message: str) -> None:
    console.print(escape(message), highlight=False, soft_wrap=True)


def fail(message: str) -> ToolError:
    """A failure to raise; `smtriton` prints it as one line and exits 1."""
    return ToolError(message)


def pairs(values: list[str] | None, what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values or []:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} {value!r} is not KEY=VALUE")
        pairs[key] = rest
    return pairs


def open_session(region: str | None, profile: str | None, endpoint_url: str | None = None):
    from smtriton.aws.session import aws_session

    return aws_session(region, profile, endpoint_url)


def _build_spec(tag: str, target: str, base_image: str | None, platform: str, build_arg: list[str] | None) -> BuildSpec:
    if target not in TARGETS:
        raise typer.BadParameter(f"--target must be one of {', '.join(TARGETS)}")
    return BuildSpec(
        tag=tag,
        target=target,
        base_image=base_image,
        platform=platform or None,
        build_args=pairs(build_arg, "--build-arg"),
    )


def build_image_command(
    tag: Annotated[str, typer.Option(help="Local image name:tag")] = "smtriton:latest",
    target: TargetOpt = "triton",
    base_image: BaseOpt = None,
    platform: PlatformOpt = "linux/amd64",
    build_arg: BuildArgOpt = None,
    dry_run: Annotated[bool, typer.Option(help="Print the docker command instead of running it")] = False,
) -> None:
    """Build the serving image with docker buildx (the Dockerfile at the project root)."""
    from smtriton.aws.docker_image import build_argv, build_image

    spec = _build_spec(tag, target, base_image, platform, build_arg)
    if dry_run:
        print(" ".join(build_argv(spec)))
        return
    build_image(spec, SubprocessRunner())
    print(tag)


def push_image_command(
    repository: Annotated[str, typer.Option(help="ECR repository (created when missing)")] = "smtriton",
    tag: Annotated[str, typer.Option(help="Image tag in the repository")] = "latest",
    target: TargetOpt = "triton",
    base_image: BaseOpt = None,
    platform: PlatformOpt = "linux/amd64",
    build_arg: BuildArgOpt = None,
    no_build: Annotated[
        bool, typer.Option("--no-build", help="Push an image built before (--local-image) instead of building")
    ] = False,
    local_image: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Local image to push with --no-build [default: smtriton:<tag>]"),
    ] = None,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Build the image, create the ECR repository if missing, log docker in, tag, push; print the image URI."""
    from smtriton.aws.ecr import push_image

    session = open_session(region, profile)
    build = None if no_build else _build_spec(f"smtriton:{tag}", target, base_image, platform, build_arg)
    result = push_image(
        session,
        repository,
        tag,
        SubprocessRunner(),
        build=build,
        local_image=local_image or f"smtriton:{tag}",
        progress=say,
    )
    print(result.image_uri)
