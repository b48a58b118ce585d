"""botocore clients answered by ``Stubber``: every request the code sends is validated against botocore's
service model (the client's own parameter validation stays on) and, where a test gives them, compared
with the expected parameters; every answer is validated against the operation's output shape.

A test queues, per client and in order, what AWS answers; a call nobody queued fails the test, and
``with`` checks that every queued answer was asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import botocore.session
from botocore.stub import ANY, Stubber

__all__ = [
    "ACCOUNT", "ANY", "REGION", "Clients", "endpoint", "endpoint_config", "model", "moto_credentials", "streaming",
    "team_profile", "valid", "vpc_hosting",
]  # fmt: skip

ACCOUNT = "123456789012"
REGION = "us-east-1"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SERVICES = {
    "sagemaker": "sagemaker",
    "autoscaling": "application-autoscaling",
    "cloudwatch": "cloudwatch",
    "s3": "s3",
    "ecr": "ecr",
    "runtime": "sagemaker-runtime",
}


class Clients:
    """One stubbed client per service, as attributes (``sagemaker``, ``autoscaling``, ``cloudwatch``, ...)."""

    def __init__(self) -> None:
        session = botocore.session.get_session()
        self.stubbers: dict[str, Stubber] = {}
        for attr, service in SERVICES.items():
            client = session.create_client(
                service, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
            )
            setattr(self, attr, client)
            self.stubbers[attr] = Stubber(client)

    def answer(self, client: str, operation: str, response: Mapping[str, Any] | None = None, **expected: Any) -> None:
        """Queue ``response`` to ``operation``; with ``expected``, the request must have exactly those parameters."""
        self.stubbers[client].add_response(operation, dict(response or {}), expected or None)

    def fail(
        self, client: str, operation: str, code: str, message: str = "", status: int = 400, **expected: Any
    ) -> None:
        self.stubbers[client].add_client_error(
            operation, service_error_code=code, service_message=message, http_status_code=status,
            expected_params=expected or None,
        )  # fmt: skip

    def __enter__(self) -> Clients:
        for stubber in self.stubbers.values():
            stubber.activate()
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        for stubber in self.stubbers.values():
            stubber.deactivate()
        if kind is None:
            for stubber in self.stubbers.values():
                stubber.assert_no_pending_responses()


def arn(kind: str, name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{kind}/{name}"


def endpoint(
    name: str,
    status: str,
    config: str,
    *,
    instances: int | None = None,
    image: str | None = None,
    digest: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """DescribeEndpoint's answer."""
    described: dict[str, Any] = {
        "EndpointName": name,
        "EndpointArn": arn("endpoint", name),
        "EndpointConfigName": config,
        "EndpointStatus": status,
        "CreationTime": T0,
        "LastModifiedTime": T0,
    }
    variant: dict[str, Any] = {"VariantName": "AllTraffic"}
    if instances is not None:
        variant.update(CurrentInstanceCount=instances, DesiredInstanceCount=instances)
    if image is not None:
        variant["DeployedImages"] = [{"SpecifiedImage": image, "ResolvedImage": f"{image.split(':')[0]}@{digest}"}]
    described["ProductionVariants"] = [variant]
    if reason:
        described["FailureReason"] = reason
    return described


def endpoint_config(name: str, model_name: str, **variant: Any) -> dict[str, Any]:
    """DescribeEndpointConfig's answer: one variant, AllTraffic."""
    return {
        "EndpointConfigName": name,
        "EndpointConfigArn": arn("endpoint-config", name),
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": model_name, **variant}],
        "CreationTime": T0,
    }


def model(name: str, container: Mapping[str, Any], role: str) -> dict[str, Any]:
    """DescribeModel's answer."""
    return {
        "ModelName": name,
        "ModelArn": arn("model", name),
        "PrimaryContainer": dict(container),
        "ExecutionRoleArn": role,
        "CreationTime": T0,
    }


def valid(service: str, operation: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` checked against the operation's input shape in botocore's service model (what a
    client validates before sending); returned for further checks."""
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model(service)
    validate_parameters(dict(params), model.operation_model(operation).input_shape)
    return params


def streaming(body: bytes) -> Any:
    """The ``Body`` of an InvokeEndpoint answer."""
    import io

    from botocore.response import StreamingBody

    return StreamingBody(io.BytesIO(body), len(body))


def team_profile(folder: Path, monkeypatch: Any, region: str | None = None) -> None:
    """Only an AWS profile ``team`` (access key ``TEAMKEY``, ``region`` if given) to take credentials from:
    what ``--profile team`` must reach, and nothing in the environment that would win over it."""
    config = folder / "aws-config"
    lines = ["[profile team]", "aws_access_key_id = TEAMKEY", "aws_secret_access_key = s"]
    config.write_text("\n".join([*lines, *([f"region = {region}"] if region else [])]) + "\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-credentials"))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)


def moto_credentials(monkeypatch: Any) -> None:
    """The fake credentials and region moto's in-process mocks take."""
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)


def vpc_hosting() -> Any:
    """Every deployment option at once: a VPC, isolation, a KMS key, a volume and a download timeout."""
    from smtriton.aws.hosting import Hosting

    return Hosting(
        model_download_timeout_s=1200,
        volume_size_gb=100,
        subnets=("subnet-0123456789abcdef0",),
        security_groups=("sg-0123456789abcdef0",),
        network_isolation=True,
        kms_key="alias/ml",
    )
