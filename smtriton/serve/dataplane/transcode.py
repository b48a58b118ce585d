"""Large JSON inference requests re-encoded in Triton's binary form before they are forwarded.

Triton reads JSON tensor data slowly: a 1x3x224x224 FP32 image sent as JSON costs it ~24 ms more CPU
than the same image sent binary (bench/NOTES.md). simdjson reads those numbers straight into a buffer
in ~5 ms, so the front re-encodes the request and Triton skips its parse: the one place where a Python
front can beat the C++ one. Nothing else changes: outputs are still asked for the way the request
asked (JSON unless it said binary), so the answer is the one Triton gives to the JSON request. Any
request this module is not certain about (BOOL, BYTES or FP16 data, strings or booleans among numbers,
numbers out of the type's range, element count not matching the shape, shared memory, duplicate keys,
invalid JSON) goes to Triton as it came, and Triton answers it with its own words.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from smtriton import dtypes
from smtriton.serve.dataplane import guard
from smtriton.serve.dataplane.codec import RequestBody
from smtriton.serve.errors import BadRequest

# numpy kind -> simdjson buffer kind: "d" doubles, "i" int64, "u" uint64.
_BUFFER_KIND: dict[str, Literal["d", "i", "u"]] = {"f": "d", "i": "i", "u": "u"}
# Sent as they came: BOOL and BYTES are no numbers, and Triton refuses FP16 and BF16 data in JSON.
_NOT_TRANSCODED = frozenset({"BOOL", "BYTES", "FP16", "BF16"})
# datatype -> (simdjson buffer kind, numpy type), built once: a request only looks it up.
_NUMERIC: dict[str, tuple[Literal["d", "i", "u"], type[np.generic]]] = {
    name: (_BUFFER_KIND[dtype.kind], dtype.type)
    for name, dtype in ((n, dtypes.numpy_dtype(n)) for n in dtypes.TRITON_DTYPES if n not in _NOT_TRANSCODED)
}


def _limits(kind: str, numeric: type[np.generic]) -> tuple[Any, Any]:
    info: Any = np.finfo(numeric) if kind == "d" else np.iinfo(numeric)  # type: ignore[arg-type]
    return info.min, info.max


# numpy type -> the (min, max) its values must lie within, built once.
_LIMITS = {numeric: _limits(kind, numeric) for kind, numeric in _NUMERIC.values()}
_WIDE: dict[str, type[np.generic]] = {"d": np.float64, "i": np.int64, "u": np.uint64}


class _Unsure(Exception):
    """The request is sent as it came."""


def to_binary(body: RequestBody) -> tuple[bytes, int] | None:
    """``(binary body, JSON header length)`` for a plain JSON inference request, else None.

    Raises for a body that could crash Triton (:mod:`smtriton.serve.dataplane.guard`): the parse here is the
    depth and declared-size check of the large bodies that come this way, whether or not they are
    re-encoded.
    """
    try:
        document = simdjson.Parser().parse(body)
    except (RuntimeError, ValueError) as exc:  # simdjson could not parse it
        guard.refuse_unparsed(body, exc)
        return None
    try:
        guard.check_declared_elements(document, len(body))  # a lying shape is refused, never forwarded
        return _encode(document)
    except BadRequest:
        raise
    except Exception:  # _Unsure, wrong types, 64-bit overflow...: an optimisation only, so
        return None  # whatever it cannot do, Triton does with its own error message
    finally:
        del document


def _encode(document: Any) -> tuple[bytes, int]:
    if not isinstance(document, simdjson.Object):
        raise _Unsure
    request = _plain_object(document, skip="inputs")
    inputs = document["inputs"]
    if not isinstance(inputs, simdjson.Array) or len(inputs) == 0:
        raise _Unsure
    headers: list[dict[str, Any]] = []
    parts: list[bytes] = []
    for spec in inputs:
        if not isinstance(spec, simdjson.Object):
            raise _Unsure
        header = _plain_object(spec, skip="data")
        data = spec["data"]
        raw = _tensor_bytes(header, data)
        parameters = header.setdefault("parameters", {})
        if not isinstance(parameters, dict) or any(key in parameters for key in guard.DATA_ELSEWHERE):
            raise _Unsure
        parameters["binary_data_size"] = len(raw)
        headers.append(header)
        parts.append(raw)
    request["inputs"] = headers
    head = orjson.dumps(request)
    return b"".join([head, *parts]), len(head)


def _plain_object(obj: Any, skip: str) -> dict[str, Any]:
    """Every member but ``skip`` as plain Python values; ``skip`` must be present, keys unique."""
    keys = list(obj.keys())
    if len(set(keys)) != len(keys) or skip not in keys:
        raise _Unsure
    plain: dict[str, Any] = {}
    for key in keys:
        if key != skip:
            value = obj[key]
            if isinstance(value, simdjson.Object):
                value = value.as_dict()
            elif isinstance(value, simdjson.Array):
                value = value.as_list()
            plain[key] = value
    return plain


def _tensor_bytes(header: dict[str, Any], data: Any) -> bytes:
    kind_type = _NUMERIC.get(header.get("datatype"))  # type: ignore[arg-type]
    shape = header.get("shape")
    if kind_type is None or not isinstance(data, simdjson.Array) or not isinstance(shape, list):
        raise _Unsure
    if not all(type(d) is int and d >= 0 for d in shape):
        raise _Unsure
    kind, dtype = kind_type
    wide = np.frombuffer(data.as_buffer(of_type=kind), dtype=_WIDE[kind])
    if wide.size != math.prod(shape):
        raise _Unsure
    if wide.size and dtype is not np.float64:
        # Out of the type's range Triton's own cast decides (and may differ): leave those to it.
        low, high = _LIMITS[dtype]
        if wide.min() < low or wide.max() > high:
            raise _Unsure
    return wide.astype(dtype, copy=False).tobytes()
