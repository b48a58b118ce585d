"""Large JSON inference requests re-encoded in Triton's binary form before they are forwarded.

Triton reads JSON tensor data slowly: a 1x3x224x224 FP32 image sent as JSON costs it ~24 ms more CPU
than the same image sent binary (bench/NOTES.md). simdjson reads those numbers straight into a buffer
in ~5 ms, so the front re-encodes the request and Triton skips its parse: the one place where a Python
front can beat the C++ one. Nothing else changes: outputs are still asked for the way the request
asked (JSON unless it said binary), so the answer is the one Triton gives to the JSON request. Any
request this module is not certain about (BOOL, BYTES or FP16 data, strings or booleans among numbers,
numbers out of the type's range, element count not matching the shape, shared memory) goes to Triton
as it came, and Triton answers it with its own words. What is re-encoded is what the request's one
reading (:mod:`smtriton.serve.dataplane.reading.inference`) read and checked; keys Triton does not read are not
carried over.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from smtriton import dtypes
from smtriton.serve.dataplane.reading.codec import DATA_ELSEWHERE

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


def to_binary(document: Any, header: dict[str, Any]) -> tuple[bytes, int, dict[str, Any]] | None:
    """``(binary body, JSON header length, JSON header)`` for a JSON inference request that the reading
    (:mod:`smtriton.serve.dataplane.reading.inference`) parsed into ``document`` (simdjson's) and ``header`` (its
    values but the inputs' data, already checked); None when it is sent as it came."""
    try:
        return _encode(document, header)
    except Exception:  # _Unsure, wrong types, 64-bit overflow...: an optimisation only, so
        return None  # whatever it cannot do, Triton does with its own error message


def _encode(document: Any, header: dict[str, Any]) -> tuple[bytes, int, dict[str, Any]]:
    specs = header.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise _Unsure
    inputs: list[dict[str, Any]] = []
    parts: list[bytes] = []
    for spec, read in zip(specs, document["inputs"], strict=True):
        if not isinstance(spec, dict) or "data" not in spec:
            raise _Unsure
        encoded = _known(spec, skip="data")
        raw = _tensor_bytes(encoded, read["data"])
        parameters = encoded.setdefault("parameters", {})
        if not isinstance(parameters, dict) or any(key in parameters for key in DATA_ELSEWHERE):
            raise _Unsure
        encoded["parameters"] = {**parameters, "binary_data_size": len(raw)}
        inputs.append(encoded)
        parts.append(raw)
    request = _known(header, skip="inputs")
    request["inputs"] = inputs
    head = orjson.dumps(request)
    return b"".join([head, *parts]), len(head), request


def _known(obj: dict[str, Any], skip: str) -> dict[str, Any]:
    """The members the reading read, but ``skip``: what Triton reads of them (the rest it ignores)."""
    return {key: value for key, value in obj.items() if key != skip and value is not ...}


def _tensor_bytes(header: dict[str, Any], data: Any) -> bytes:
    shape = header.get("shape")
    datatype = header.get("datatype")
    if numeric_type(datatype) is None or not isinstance(data, simdjson.Array) or not isinstance(shape, list):
        raise _Unsure
    if not all(type(d) is int and d >= 0 for d in shape):
        raise _Unsure
    try:
        flat = values(data, str(datatype))
    except NotNumbers:
        raise _Unsure from None
    if flat.size != math.prod(shape):
        raise _Unsure
    return flat.tobytes()


class NotNumbers(ValueError):
    """JSON data that is not all numbers of a tensor's kind within its type's range."""


def numeric_type(datatype: object) -> np.dtype[Any] | None:
    """The numpy type of a datatype whose JSON data is re-encoded (None: BOOL, BYTES, FP16, unknown)."""
    kind_type = _NUMERIC.get(datatype) if isinstance(datatype, str) else None
    return np.dtype(kind_type[1]) if kind_type is not None else None


def values(data: Any, datatype: str) -> np.ndarray[Any, Any]:
    """A simdjson array's numbers (its nesting flattened) as ``datatype``; :class:`NotNumbers` when one
    is no number of its kind (an integer type takes integers only) or lies out of the type's range
    (Triton's own cast would decide those, and might differ)."""
    kind, dtype = _NUMERIC[datatype]
    try:
        wide = np.frombuffer(data.as_buffer(of_type=kind), dtype=_WIDE[kind])
    except (TypeError, ValueError, RuntimeError):
        raise NotNumbers(f"{datatype} data must be {'numbers' if kind == 'd' else 'integers'}") from None
    if wide.size and dtype is not np.float64:
        low, high = _LIMITS[dtype]
        if wide.min() < low or wide.max() > high:
            raise NotNumbers(f"a value lies out of {datatype}'s range")
    return wide.astype(dtype, copy=False)
