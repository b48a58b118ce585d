"""What every SageMaker resource smtriton makes has in common: its errors, its name, its tag, and how
an AWS error is read.

Everything created carries the tag ``smtriton:endpoint=<endpoint>`` (or ``smtriton:transform-job=<job>``),
so that deleting removes exactly what smtriton made and never a resource someone else made.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from smtriton.errors import ToolError

MANAGED_TAG = "smtriton:endpoint"
NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
# ``AccessDenied`` answers: the caller lacks a permission; retrying does not help.
ACCESS_DENIED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})


class DeployError(ToolError, RuntimeError):
    """The deployment is invalid, or SageMaker reported a failure."""


class WaitTimeout(DeployError):
    """SageMaker's status could not be seen to settle (patience ran out, or it cannot be read): nothing
    is rolled back, SageMaker goes on with what it was doing."""


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ``ClientError`` ('' for anything else)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, Mapping) else ""


def error_text(exc: BaseException) -> str:
    """``Code: message`` of a ``ClientError``; the exception's own text otherwise."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and response.get("Error"):
        error = response["Error"]
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".rstrip(": ")
    return str(exc)


def is_access_denied(exc: BaseException) -> bool:
    return error_code(exc) in ACCESS_DENIED


def is_not_found(exc: BaseException) -> bool:
    """SageMaker says "Could not find" (a ValidationException) for a missing endpoint, configuration,
    model or component, and ``ResourceNotFound`` for a missing job."""
    code = error_code(exc)
    return code == "ResourceNotFound" or (code == "ValidationException" and "Could not find" in str(exc))


def described_or_none(describe: Callable[..., Any], **name: str) -> dict[str, Any] | None:
    """``describe(**name)`` (a boto3 Describe* call), or None when SageMaker says there is no such resource."""
    from botocore.exceptions import ClientError

    try:
        return describe(**name)
    except ClientError as exc:
        if is_not_found(exc):
            return None
        raise


def check_name(name: str, what: str = "endpoint name") -> None:
    if not NAME_RE.match(name):
        raise DeployError(f"{what} {name!r}: letters, digits and single hyphens, at most 63 characters")


def tags(key: str, value: str, extra: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """The managed tag first, then the user's (never a second managed tag)."""
    users = ({"Key": str(k), "Value": str(v)} for k, v in (extra or {}).items() if k != key)
    return [{"Key": key, "Value": value}, *users]


def is_managed(sm: Any, arn: str, value: str, key: str = MANAGED_TAG) -> bool:
    found = sm.list_tags(ResourceArn=arn).get("Tags", [])
    return any(t["Key"] == key and t["Value"] == value for t in found)


def resource_name(base: str, now: datetime | None = None) -> str:
    """A fresh model / endpoint-config name: ``base``, a UTC time stamp and a random suffix (<= 63)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d%H%M%S")
    return f"{base[:43].rstrip('-')}-{stamp}-{secrets.token_hex(2)}"


def name_prefix(base: str) -> str:
    """What every :func:`resource_name` of ``base`` starts with (to list leftovers)."""
    return base[:43].rstrip("-")
