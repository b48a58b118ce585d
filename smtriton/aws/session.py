"""The boto3 session of every command that calls AWS: the region and the credentials are checked before
anything is sent, and each one missing is one line saying what to set.

The region is ``--region``, else ``AWS_REGION`` (the variable the AWS SDKs and the AWS CLI v2 read
first, which botocore itself ignores), else boto3's own chain (``AWS_DEFAULT_REGION``, the profile).
"""

from __future__ import annotations

import os
from typing import Any

from smtriton.errors import ToolError, ToolUsageError

NO_REGION = "no AWS region: pass --region or set AWS_REGION"
NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
    "or run where a role provides them"
)


def aws_session(region: str | None = None, profile: str | None = None, *, need_region: bool = True) -> Any:
    """A ``boto3.Session`` with a region and credentials, or a :class:`ToolError` saying which is missing
    (``need_region=False``: S3 finds a bucket's region itself)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ProfileNotFound

    try:
        session = boto3.Session(region_name=region or os.environ.get("AWS_REGION") or None, profile_name=profile)
    except ProfileNotFound as exc:
        raise ToolUsageError(str(exc)) from None
    if need_region and not session.region_name:
        raise ToolError(NO_REGION)
    try:
        credentials = session.get_credentials()
    except BotoCoreError as exc:  # a profile whose credential source fails (an expired SSO login, ...)
        raise ToolError(f"AWS credentials: {exc}") from None
    if credentials is None:
        raise ToolError(NO_CREDENTIALS)
    return session


def s3_client(region: str | None = None, profile: str | None = None) -> Any:
    """An S3 client of the session ``--region`` and ``--profile`` choose, as every other AWS call's."""
    return aws_session(region, profile, need_region=False).client("s3")
