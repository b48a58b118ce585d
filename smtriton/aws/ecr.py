"""Amazon ECR: create the repository if missing, log docker in with a boto3 token, tag and push.

Region and account come from the boto3 session (the repository URI ECR returns carries both).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smtriton.aws.docker_image import (
    BuildSpec,
    Runner,
    build_image,
    docker_login,
    ecr_registry_of,
    push_argv,
    tag_argv,
)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class PushResult:
    image_uri: str
    repository_uri: str
    created_repository: bool


def ensure_repository(ecr: Any, name: str, *, scan_on_push: bool = True) -> tuple[str, bool]:
    """(repository URI, whether it was created now). Creates the repository only when it is missing."""
    try:
        found = ecr.describe_repositories(repositoryNames=[name])["repositories"][0]
        return found["repositoryUri"], False
    except ecr.exceptions.RepositoryNotFoundException:
        pass
    try:
        created = ecr.create_repository(
            repositoryName=name,
            imageScanningConfiguration={"scanOnPush": scan_on_push},
            imageTagMutability="MUTABLE",
            tags=[{"Key": "managed-by", "Value": "smtriton"}],
        )["repository"]
        return created["repositoryUri"], True
    except ecr.exceptions.RepositoryAlreadyExistsException:  # created concurrently
        return ecr.describe_repositories(repositoryNames=[name])["repositories"][0]["repositoryUri"], False


def authorization(ecr: Any) -> tuple[str, str, str]:
    """(username, password, registry endpoint) from ECR's GetAuthorizationToken."""
    data = ecr.get_authorization_token()["authorizationData"][0]
    username, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    return username, password, data["proxyEndpoint"]


def login(ecr: Any, runner: Runner, registry: str | None = None, docker: str = "docker") -> str:
    """Log docker in to ``registry`` (default: the session's own registry); returns the registry host."""
    username, password, endpoint = authorization(ecr)
    host = registry or endpoint.removeprefix("https://").removeprefix("http://").rstrip("/")
    docker_login(runner, host, username, password, docker)
    return host


def push_image(
    session: Any,
    repository: str,
    tag: str,
    runner: Runner,
    *,
    build: BuildSpec | None = None,
    local_image: str | None = None,
    endpoint_url: str | None = None,
    progress: Progress = _quiet,
    docker: str = "docker",
) -> PushResult:
    """Build (when ``build`` is given), make sure the repository exists, log in, tag, push; returns the URI.

    ``local_image`` names an image already built (default: the build's tag). When the build's base image
    lives in ECR (AWS's sagemaker-tritonserver), docker is logged in to that registry first, with a token
    from the base registry's region.
    """
    ecr = session.client("ecr", endpoint_url=endpoint_url)
    if build is not None:
        base = ecr_registry_of(build.base_image or "")
        if base is not None:
            host, _, region = base
            base_ecr = ecr
            if region != session.region_name:
                base_ecr = session.client("ecr", region_name=region, endpoint_url=endpoint_url)
            progress(f"logging in to the base image's registry {host}")
            login(base_ecr, runner, registry=host, docker=docker)
        progress(f"building {build.tag} (target {build.target})")
        local_image = build_image(build, runner, docker)
    if not local_image:
        raise ValueError("nothing to push: give a build or a local image")
    repository_uri, created = ensure_repository(ecr, repository)
    progress(f"{'created' if created else 'using'} ECR repository {repository_uri}")
    host = login(ecr, runner, registry=repository_uri.partition("/")[0], docker=docker)
    progress(f"logged in to {host}")
    image_uri = f"{repository_uri}:{tag}"
    runner(tag_argv(local_image, image_uri, docker))
    progress(f"pushing {image_uri}")
    runner(push_argv(image_uri, docker))
    return PushResult(image_uri=image_uri, repository_uri=repository_uri, created_repository=created)
