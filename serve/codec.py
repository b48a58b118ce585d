"""SageMaker content types <-> Triton's KServe binary extension (CONTRACT.md §3).

The two encodings carry the same bytes; only the header that says where the JSON part ends differs:
SageMaker puts it in the Content-Type (``...binary+json;json-header-size=N``), Triton in
``Inference-Header-Content-Length: N``. Nothing here looks inside a tensor.
"""

from __future__ import annotations

from serve.errors import BadRequest

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"
BINARY_JSON_PREFIX = f"{BINARY_JSON};json-header-size="
JSON = "application/json"


def request_header_length(content_type: str | None, body_length: int) -> int | None:
    """Where the JSON part of a request ends: None for a pure JSON body, else the byte count.

    0 means raw mode (the whole body is the one input's bytes), as native does for ``=0`` and for an
    empty body. Parsing is tolerant where meaning is clear (case, spaces, parameter order) and strict
    where native silently misreads (a non-numeric size is an error, not raw mode).
    """
    if body_length == 0:
        return 0
    if not content_type:
        return None
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type != BINARY_JSON:
        if BINARY_JSON in content_type.lower():
            raise BadRequest(
                f"expect MIME type for binary data starts with '{BINARY_JSON_PREFIX}', got: {content_type}"
            )
        return None
    size: str | None = None
    for param in params.split(";"):
        key, sep, value = param.partition("=")
        if sep and key.strip().lower() == "json-header-size":
            size = value.strip().strip('"')
    if size is None:
        raise BadRequest(f"content type {BINARY_JSON} needs the parameter json-header-size")
    if not size.isascii() or not size.isdigit():
        raise BadRequest(f"invalid json-header-size '{size}'")
    length = int(size)
    if length > body_length:
        raise BadRequest(f"inference header size should be in range (0, {body_length}), got: {size}")
    return length


def response_content_type(triton_header_length: int | None) -> str:
    """The SageMaker Content-Type for a Triton response (binary iff Triton sent the header)."""
    if triton_header_length is None:
        return JSON
    return f"{BINARY_JSON_PREFIX}{triton_header_length}"
