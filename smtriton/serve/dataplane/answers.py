"""Triton's answers mapped onto SageMaker's, in one place.

Status codes (docs/contract.md §2.6), content types (§3.3), the custom attributes a model sets (§7), the
multi-model endpoint's renaming of ``model_name`` (§4.1), and the framing of streamed responses
(JSON lines or server-sent events). Nothing here talks to Triton or knows HTTP's wire.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from smtriton.serve.dataplane.reading import codec
from smtriton.serve.dataplane.reading.codec import JSON
from smtriton.serve.errors import error_body
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.triton.client import UpstreamResponse, error_text

# docs/contract.md §7: the custom attributes header travels to the model as this request parameter,
# and a response parameter of the same name set by the model comes back as the header.
CUSTOM_ATTRIBUTES = "sagemaker_custom_attributes"
SSE = "text/event-stream"
JSON_LINES = "application/jsonlines"

# Triton answers 500 for request-parsing failures; they are client errors (docs/contract.md §2.6, §6 B11).
_PARSE_ERROR_PREFIXES = (b'{"error":"failed to parse the request JSON buffer', b'{"error":"Unable to parse')

Answer = tuple[int, str, bytes]  # status, content type, body
_NOT_IN_A_HEADER = re.compile("[\x00-\x08\x0a-\x1f\x7f]")

# ONNX Runtime refusing the request's data: its INVALID_ARGUMENT status (a token id out of an
# embedding's range, a wrong rank), and its FAIL status for shapes that cannot broadcast. The
# onnxruntime backend (NVIDIA's native one and ours alike) reports both as a 500 "onnx runtime error
# <code>: ..."; they are the client's mistakes, so they are answered 400, in both images.
_ORT_INVALID_ARGUMENT = b'{"error":"onnx runtime error 2: '
_ORT_FAIL = b'{"error":"onnx runtime error 1: '


def rejected_input(body: bytes) -> bool:
    """Whether a 500 from Triton is the model's backend refusing the request's data."""
    if body.startswith(_ORT_INVALID_ARGUMENT):
        return True
    return body.startswith(_ORT_FAIL) and b"broadcast" in body


def to_sagemaker(upstream: UpstreamResponse) -> Answer:
    """SME mapping of a Triton answer: headers rewritten, Triton's status kept but parse errors → 400."""
    if upstream.status == 200:
        return 200, codec.response_content_type(upstream.header_length), upstream.body
    status = upstream.status
    unread = upstream.body.startswith(_PARSE_ERROR_PREFIXES)
    if status == 500 and (unread or rejected_input(upstream.body)):
        status = 400
    if unread:  # Triton's words, then what a body may be
        return status, JSON, error_body(f"{error_text(upstream.body)}; {codec.ACCEPTED_BODIES}")
    if not upstream.body.startswith(b'{"error":'):
        return status, JSON, error_body(upstream.body.decode("utf-8", errors="replace") or "inference failed")
    if b"::" in upstream.body:  # re-encode only when a repository path must be stripped (§6 B14)
        return status, JSON, error_body(error_text(upstream.body))
    return status, JSON, upstream.body


def failure_message(upstream: UpstreamResponse) -> str:
    """The error text of a failed Triton answer."""
    return error_text(upstream.body) or "inference failed"


def may_be_out_of_memory(upstream: UpstreamResponse) -> bool:
    """Whether an MME invoke's failure needs the out-of-memory verdict (docs/contract.md §4.6)."""
    return upstream.status not in (200, 503)


def to_mme_response(record: ModelRecord, upstream: UpstreamResponse, out_of_memory: bool = False) -> Answer:
    """MME mapping of a Triton answer (docs/contract.md §2.6): 200 as SME with the client's model name
    put back; errors 507 on out-of-memory (``out_of_memory``: the endpoint's verdict on this failure),
    404 if the model is gone, 503 if Triton is, else 400."""
    if upstream.status == 200:
        body, header_length = upstream.body, upstream.header_length
        if record.response_name != record.triton_name:
            body, header_length = rename_in_response(body, header_length, record.triton_name, record.response_name)
        return 200, codec.response_content_type(header_length), body
    message = record.in_callers_terms(failure_message(upstream))  # no staging path, the caller's names
    if upstream.body.startswith(_PARSE_ERROR_PREFIXES):
        message = f"{message}; {codec.ACCEPTED_BODIES}"
    if upstream.status == 503:
        return 503, JSON, error_body(message)
    status = 507 if out_of_memory else 404 if upstream.status == 404 else 400
    return status, JSON, error_body(message)


def rename_in_response(
    body: bytes, header_length: int | None, triton_name: str, shown: str
) -> tuple[bytes, int | None]:
    """Put the client's name back in a response served under a derived Triton name (docs/contract.md §4.1)."""
    old = b'"model_name":' + orjson.dumps(triton_name)
    new = b'"model_name":' + orjson.dumps(shown)
    end = len(body) if header_length is None else header_length
    at = body.find(old, 0, end)
    if at < 0:
        return body, header_length
    body = body[:at] + new + body[at + len(old) :]
    return body, None if header_length is None else header_length + len(new) - len(old)


def custom_attributes(upstream: UpstreamResponse) -> str | None:
    """The custom attributes a model set on a successful response, for the response header; None
    when it set none, or a value no HTTP header may carry (control characters, line breaks)."""
    if upstream.status != 200:
        return None
    value = codec.response_parameter(upstream.body, upstream.header_length, CUSTOM_ATTRIBUTES)
    if value is None or _NOT_IN_A_HEADER.search(value):
        return None
    return value


def stream_media_type(accept: str | None) -> str:
    """Server-sent events when the client asked for them, else JSON lines."""
    return SSE if accept is not None and SSE in accept else JSON_LINES


async def framed(responses: AsyncIterator[dict[str, Any]], media_type: str) -> AsyncGenerator[bytes, None]:
    """Each streamed response as one chunk: a JSON line, or a server-sent event."""
    sse = media_type == SSE
    async for value in responses:
        data = orjson.dumps(value)
        yield b"data: " + data + b"\n\n" if sse else data + b"\n"
