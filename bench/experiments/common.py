"""What every prototype front shares: settings from the environment, the content-type mapping."""

from __future__ import annotations

import os

BINARY_PREFIX = b"application/vnd.sagemaker-triton.binary+json;json-header-size="
JSON = b"application/json"


def triton_address() -> tuple[str, int, str]:
    host, _, port = os.environ["BENCH_TRITON_URL"].rpartition(":")
    return host, int(port), os.environ["BENCH_MODEL"]


def request_header_length(content_type: bytes | None) -> int | None:
    """SageMaker's binary+json Content-Type -> Triton's Inference-Header-Content-Length (None: JSON)."""
    if content_type is not None and content_type.startswith(BINARY_PREFIX):
        return int(content_type[len(BINARY_PREFIX) :])
    return None


def response_content_type(header_length: bytes | None) -> bytes:
    return JSON if header_length is None else BINARY_PREFIX + header_length
