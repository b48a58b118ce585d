"""The boto3 session of every command that calls AWS: the region and the credentials are checked before
anything is sent, and each one missing is one line saying what to set.

The region is ``--region``, else ``AWS_REGION`` (the variable the AWS SDKs and the AWS CLI v2 read
first, which botocore itself ignores), else boto3's own chain (``AWS_DEFAULT_REGION``, the profile).

An endpoint URL on this machine (``smtriton local-endpoint``'s ``http://127.0.0.1:8090``) is no AWS
service: it checks neither the region nor the signature, so where none is configured placeholders
stand in for them instead of a refusal.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any
from urllib.parse import urlsplit

from smtriton.errors import ToolError, ToolUsageError

NO_REGION = "no AWS region: pass --region or set AWS_REGION"
NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
    "or run where a role provides them"
)
# What a local endpoint is called with when nothing is configured: any values do.
LOCAL_REGION = "us-east-1"
LOCAL_KEY = "local"


def is_local(endpoint_url: str | None) -> bool:
    """Whether ``endpoint_url`` points at this machine (localhost or a loopback address)."""
    if not endpoint_url:
        return False
    try:
        host = urlsplit(endpoint_url).hostname
    except ValueError:
        return False
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def aws_session(
    region: str | None = None, profile: str | None = None, endpoint_url: str | None = None, *, need_region: bool = True
) -> Any:
    """A ``boto3.Session`` with a region and credentials, or a :class:`ToolError` saying which is missing
    (for a local ``endpoint_url``: placeholders for whichever is missing; ``need_region=False``: S3 finds
    a bucket's region itself)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ProfileNotFound

    local = is_local(endpoint_url)
    try:
        session = boto3.Session(region_name=region or os.environ.get("AWS_REGION") or None, profile_name=profile)
    except ProfileNotFound as exc:
        raise ToolUsageError(str(exc)) from None
    region_name = session.region_name or (LOCAL_REGION if local else None)
    if need_region and not region_name:
        raise ToolError(NO_REGION)
    try:
        credentials = session.get_credentials()
    except BotoCoreError as exc:  # a profile whose credential source fails (an expired SSO login, ...)
        if not local:
            raise ToolError(f"AWS credentials: {exc}") from None
        credentials = None
    if credentials is None:
        if not local:
            raise ToolError(NO_CREDENTIALS)
        return boto3.Session(aws_access_key_id=LOCAL_KEY, aws_secret_access_key=LOCAL_KEY, region_name=region_name)
    if region_name != session.region_name:
        return boto3.Session(region_name=region_name, profile_name=profile)
    return session


def s3_client(region: str | None = None, profile: str | None = None) -> Any:
    """An S3 client of the session ``--region`` and ``--profile`` choose, as every other AWS call's."""
    return aws_session(region, profile, need_region=False).client("s3")
