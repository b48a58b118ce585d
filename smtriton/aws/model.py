"""The serving image as a SageMaker model: the CreateModel request every deployment starts with
(endpoints, inference components, batch transform jobs), and the container environment checked with
serve's own settings before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smtriton.aws.hosting import Hosting
from smtriton.aws.resources import DeployError

ASYNC_REQUEST_TIMEOUT_S = 3600  # asynchronous inference allows up to one hour per request
ASYNC_MAX_PAYLOAD_BYTES = 1024**3  # and up to 1 GB of payload


def is_s3(url: str) -> bool:
    return url.startswith("s3://") and len(url) > 5 and not url[5:].startswith("/")


@dataclass(frozen=True)
class ServingModel:
    """``model_data``: a ``model.tar.gz``, an S3 prefix (uncompressed, single-model) or for a multi-model
    endpoint the prefix holding the archives."""

    image: str
    role_arn: str
    model_data: str | None = None
    multi_model: bool = False
    environment: Mapping[str, str] = field(default_factory=dict)
    default_model: str | None = None
    asynchronous: bool = False  # the container admits asynchronous inference's longer limits
    hosting: Hosting = field(default_factory=Hosting)

    def container_environment(self) -> dict[str, str]:
        """The user's variables plus what the kind of deployment implies."""
        env = {str(k): str(v) for k, v in self.environment.items()}
        if self.multi_model:
            env["SAGEMAKER_MULTI_MODEL"] = "true"
        if self.default_model:
            env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = self.default_model
        if self.asynchronous:
            env.setdefault("SMTRITON_REQUEST_TIMEOUT_S", str(ASYNC_REQUEST_TIMEOUT_S))
            env.setdefault("SMTRITON_MAX_PAYLOAD_BYTES", str(ASYNC_MAX_PAYLOAD_BYTES))
        return env

    def check(self) -> list[str]:
        """Raise DeployError for a model SageMaker (or serve) cannot run; warnings for dubious ones."""
        warnings: list[str] = []
        if not self.role_arn.startswith("arn:"):
            raise DeployError(f"execution role {self.role_arn!r} is not an IAM role ARN")
        data = self.model_data
        if self.multi_model:
            if not data or not is_s3(data) or data.endswith(".tar.gz"):
                raise DeployError(
                    "a multi-model endpoint needs an S3 prefix (s3://bucket/prefix/) holding the archives"
                )
            if self.default_model:
                raise DeployError("a multi-model endpoint has no default model: clients name one with TargetModel")
        elif data is None:
            warnings.append("no model data: the image itself must hold the model repository in /opt/ml/model")
        elif not is_s3(data) or not (data.endswith(".tar.gz") or data.endswith("/")):
            raise DeployError(
                f"model data {data!r}: give s3://.../model.tar.gz, or an S3 prefix ending in '/' holding the "
                "uncompressed repository"
            )
        env = self.container_environment()
        # Imported here: the runtime's settings schema (pydantic) is needed only once a deployment is checked.
        from smtriton.serve.setting_types import SettingsError
        from smtriton.serve.settings import Settings, known_variables, variables_without_effect

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
        return warnings

    def request(self, name: str, tags: list[dict[str, str]]) -> dict[str, Any]:
        """The CreateModel request."""
        container: dict[str, Any] = {"Image": self.image, "Mode": "MultiModel" if self.multi_model else "SingleModel"}
        data = self.model_data
        if data is not None:
            if self.multi_model:
                container["ModelDataUrl"] = data.rstrip("/") + "/"
            elif data.endswith(".tar.gz"):
                container["ModelDataUrl"] = data
            else:
                container["ModelDataSource"] = {
                    "S3DataSource": {"S3Uri": data, "S3DataType": "S3Prefix", "CompressionType": "None"}
                }
        env = self.container_environment()
        if env:
            container["Environment"] = env
        return {
            "ModelName": name,
            "ExecutionRoleArn": self.role_arn,
            "PrimaryContainer": container,
            **self.hosting.model_fields(),
            "Tags": tags,
        }
