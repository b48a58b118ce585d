"""Requests that would crash Triton, refused before they reach it.

Triton's JSON parser is recursive: a body nested a few hundred thousand levels deep (200,000 ``[``,
or a small gzip body that inflates to megabytes of ``[``) overflows its stack, and the whole server
dies with every request in flight. Nothing a model accepts is nested anywhere near
:data:`MAX_JSON_DEPTH` levels (a tensor of rank 8 inside a KServe request is about 12 deep), so a
deeper body is refused with 400.

Triton also allocates an input's tensor by its declared shape before it reads the data: a 100-byte
request saying ``"shape": [899970039, 4]`` makes it allocate 14 GB, and the OOM killer ends it (and
every request in flight). An element of JSON data takes at least one byte of the JSON, so a request
whose inputs declare more elements than its JSON has bytes lies, and is refused with 400 naming the
input. Inputs whose data lies elsewhere (binary data after the JSON, shared memory) are left to Triton,
which compares their byte size with the shape before it allocates anything.

The JSON is parsed by simdjson, which builds no Python object for the tensor data and stops at the
depth limit; a body it cannot parse goes on to Triton, which reports the flaw in its own words, unless
it has more brackets than the depth limit (then it might be what crashes the parser, and is refused).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import simdjson

from smtriton.serve.dataplane.codec import RequestBody
from smtriton.serve.errors import BadRequest

# simdjson's own maximum depth: the parse that checks a body stops there.
MAX_JSON_DEPTH = 1024


class JsonTooDeep(BadRequest):
    def __init__(self) -> None:
        super().__init__(f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")


def is_depth_error(exc: BaseException) -> bool:
    """Whether simdjson refused a document for its nesting depth."""
    return "DEPTH_ERROR" in str(exc)


def _brackets(body: RequestBody, end: int) -> int:
    return body.count(b"[", 0, end) + body.count(b"{", 0, end)


def refuse_unparsed(body: RequestBody, exc: BaseException, end: int | None = None) -> None:
    """After simdjson failed to parse ``body[:end]``: raise when forwarding it could crash Triton.

    simdjson checks that brackets balance before it descends, so a malformed document tells nothing
    about its depth; one with more brackets than the limit might recurse Triton's parser too deep,
    and is refused here in Triton's words for a body it cannot parse. Any other malformed body goes on
    to Triton, which reports the flaw itself.
    """
    if is_depth_error(exc):
        raise JsonTooDeep from None
    if _brackets(body, len(body) if end is None else end) > MAX_JSON_DEPTH:
        reason = str(exc).split(":", 1)[-1].split(".", 1)[0].strip()
        raise BadRequest(f"failed to parse the request JSON buffer: {reason}") from None


def check_json_depth(body: RequestBody, end: int | None = None) -> None:
    """Raise :class:`JsonTooDeep` if the JSON in ``body[:end]`` nests deeper than the limit (or
    :class:`BadRequest` if it has more brackets than the limit and does not parse)."""
    stop = len(body) if end is None else end
    if _brackets(body, stop) <= MAX_JSON_DEPTH:
        return
    try:
        document = simdjson.Parser().parse(body if stop == len(body) else body[:stop])
    except (RuntimeError, ValueError) as exc:
        refuse_unparsed(body, exc, stop)
        return
    del document


# JSON parts up to this size are parsed into Python objects (orjson: faster than simdjson's proxies on
# small documents); larger ones by simdjson, which builds no object for the tensor data.
SMALL_JSON = 16 * 1024
_OBJECTS = (dict, simdjson.Object)
_ARRAYS = (list, simdjson.Array)


def check_request(body: RequestBody, end: int | None = None) -> None:
    """Refuse an inference request whose JSON (``body[:end]``, the whole body when None) would crash
    Triton: nested deeper than the limit, or declaring more tensor elements than it could carry."""
    stop = len(body) if end is None else end
    part = body if stop == len(body) else body[:stop]
    if stop <= SMALL_JSON:
        try:
            request = orjson.loads(part)
        except orjson.JSONDecodeError:  # malformed, or nested past orjson's own limit
            check_json_depth(body, stop)
            return
        check_declared_elements(request, stop)
        return
    try:
        document = simdjson.Parser().parse(part)
    except (RuntimeError, ValueError) as exc:
        refuse_unparsed(body, exc, stop)
        return
    try:
        check_declared_elements(document, stop)
    finally:
        del document


# Parameters that say an input's data is not in the JSON: Triton checks those sizes itself.
DATA_ELSEWHERE = ("binary_data_size", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def check_declared_elements(request: Any, json_bytes: int) -> None:
    """Raise :class:`BadRequest` when the inputs of a parsed request (plain objects, or simdjson's)
    declare more elements of JSON data, together, than its ``json_bytes`` bytes of JSON could hold
    (one byte each at the least)."""
    inputs = request.get("inputs") if isinstance(request, _OBJECTS) else None
    if not isinstance(inputs, _ARRAYS):
        return
    declared = 0
    for spec in inputs:
        if not isinstance(spec, _OBJECTS):
            continue
        parameters = spec.get("parameters")
        if isinstance(parameters, _OBJECTS) and any(key in parameters for key in DATA_ELSEWHERE):
            continue
        shape = spec.get("shape")
        dims = list(shape) if isinstance(shape, _ARRAYS) else None
        if not dims or not all(type(d) is int for d in dims):
            continue  # no shape Triton would allocate by: it refuses the request itself
        elements = math.prod(abs(d) for d in dims)
        declared += elements
        if declared > json_bytes:
            name = spec.get("name")
            raise BadRequest(
                f"input '{name if isinstance(name, str) else '?'}' declares shape {dims}: {elements} elements, more "
                f"than the request's {json_bytes} bytes of JSON can hold (at least one byte an element"
                f"{', with the inputs before it' if declared > elements else ''})"
            )
