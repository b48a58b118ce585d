"""SageMaker content types <-> Triton's KServe binary extension (docs/contract.md §3).

The two encodings carry the same bytes; only the header that says where the JSON part ends differs:
SageMaker puts it in the Content-Type (``...binary+json;json-header-size=N``), Triton in
``Inference-Header-Content-Length: N``. Nothing here looks inside a tensor.
"""

from __future__ import annotations

import functools
import zlib

import orjson

from smtriton.serve.errors import BadRequest, PayloadTooLarge, UnsupportedEncoding
from smtriton.serve.triton import client

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"
BINARY_JSON_PREFIX = f"{BINARY_JSON};json-header-size="
JSON = "application/json"
# What a body may be, said where Triton could not read one: a body of another type (application/octet-
# stream, say) is read as JSON, as native does.
ACCEPTED_BODIES = (
    f"serve takes KServe v2 JSON ({JSON}; a body of a type not named here is read as JSON too), binary+json "
    f"({BINARY_JSON_PREFIX}N), JSON Lines of such requests (application/jsonlines), CSV rows (text/csv) "
    "or an encoded image (image/jpeg, image/png, application/x-image)"
)

RequestBody = client.RequestBody
# Parameters that say an input's data is not in the JSON part: Triton sizes it against the shape itself.
DATA_ELSEWHERE = ("binary_data_size", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def media_type(content_type: str | None) -> str:
    return (content_type or "").partition(";")[0].strip().lower()


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
    length = _declared_header_length(content_type)
    if length is not None and length > body_length:
        raise BadRequest(f"inference header size should be in range (0, {body_length}), got: {length}")
    return length


@functools.lru_cache(maxsize=256)  # a client sends the same few: read once each (2.5 µs a request)
def _declared_header_length(content_type: str) -> int | None:
    """What a Content-Type says of where the JSON part ends: None for a pure JSON body."""
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
    return int(size)


def response_content_type(triton_header_length: int | None) -> str:
    """The SageMaker Content-Type for a Triton response (binary iff Triton sent the header)."""
    if triton_header_length is None:
        return JSON
    return f"{BINARY_JSON_PREFIX}{triton_header_length}"


def decompress(body: RequestBody, encoding: str | None, limit: int) -> RequestBody:
    """Undo ``Content-Encoding: gzip|deflate``; the output is bounded by ``limit`` (a zip bomb is 413)."""
    if not encoding:
        return body
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return body
    if name in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif name == "deflate":
        wbits = zlib.MAX_WBITS  # RFC 9110 deflate is zlib-wrapped; raw deflate is retried below
    else:
        raise UnsupportedEncoding(f"unsupported Content-Encoding '{encoding}' (use gzip or deflate)")
    try:
        return _inflate(body, wbits, limit)
    except zlib.error:
        if name != "deflate":
            raise BadRequest("request body is not valid gzip data") from None
    try:
        return _inflate(body, -zlib.MAX_WBITS, limit)
    except zlib.error:
        raise BadRequest("request body is not valid deflate data") from None


_INFLATE_STEP = 16 << 20  # bytes inflated at most in one step


def _inflate(body: RequestBody, wbits: int, limit: int) -> RequestBody:
    """The inflated body, a bounded step at a time into one buffer: refused (413) as soon as it passes
    ``limit``, never holding more than that (a bomb stops there)."""
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending: RequestBody = body
    while pending:
        out += inflater.decompress(pending, _INFLATE_STEP)
        if len(out) > limit:
            raise PayloadTooLarge(limit)
        pending = inflater.unconsumed_tail
    out += inflater.flush()
    if len(out) > limit:
        raise PayloadTooLarge(limit)
    if not inflater.eof:
        raise zlib.error("truncated stream")
    return out


def json_part(body: RequestBody, header_length: int | None) -> RequestBody:
    return body if header_length is None else body[:header_length]


def add_request_parameters(
    body: RequestBody, header_length: int | None, values: dict[str, str | int | bool]
) -> tuple[RequestBody, int | None]:
    """Set ``parameters[key]`` for each of ``values`` in a request's JSON part (recomputing its length);
    raw mode is left alone."""
    if header_length == 0:
        return body, header_length
    try:
        request = orjson.loads(json_part(body, header_length))
    except orjson.JSONDecodeError:
        return body, header_length  # Triton will report the parse error itself
    if not isinstance(request, dict):
        return body, header_length
    parameters = request.get("parameters")
    request["parameters"] = {**(parameters if isinstance(parameters, dict) else {}), **values}
    header = orjson.dumps(request)
    if header_length is None:
        return header, None
    return header + body[header_length:], len(header)


def response_parameter(body: bytes, header_length: int | None, key: str) -> str | None:
    """A string response parameter the model set, without parsing responses that cannot have it."""
    header = json_part(body, header_length)
    if f'"{key}"'.encode() not in header:
        return None
    try:
        parameters = orjson.loads(header).get("parameters") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    value = parameters.get(key) if isinstance(parameters, dict) else None
    return value if isinstance(value, str) else None
