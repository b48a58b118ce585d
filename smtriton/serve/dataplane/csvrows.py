"""``text/csv`` bodies: one row of a model's one numeric input a line (docs/contract.md §7).

This is what SageMaker's built-in algorithms and most tabular batch transform jobs send. A model takes it
when it has exactly one input, numeric, of shape ``[batch, n]`` (``max_batch_size > 0``): every line of the
body is a row of ``n`` values, all rows go in one tensor, split into Triton requests of at most
``max_batch_size`` rows (binary, with binary outputs asked for). The answer has one line per row, in order:
``text/csv``, the row's values of every output in the order Triton gives them, flattened; or, with
``Accept: application/jsonlines``, the row's KServe v2 response (each output's shape with a batch of 1).
Values are read by one rule whatever the type: plain decimal numbers (an integer type's without a
fraction or an exponent; a floating-point type's may also be ``nan`` or ``inf``), quoted or not, with no
digit separators; a UTF-8 byte-order mark before the first row is skipped.
Any other model is refused with 415 saying what it takes. A failing request fails its rows as
:mod:`~smtriton.serve.dataplane.multirecord` says.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from smtriton import dtypes
from smtriton.serve.dataplane.answers import JSON_LINES, Answer
from smtriton.serve.dataplane.multirecord import EMPTY_LINE, Failure, Line, Outcome, error_message, media_type
from smtriton.serve.dataplane.reading import Inference
from smtriton.serve.errors import BadRequest, ServeError, UnsupportedMediaType
from smtriton.serve.triton.client import RequestBody, UpstreamResponse

CSV = "text/csv"
NUMERIC = dtypes.INTEGER | dtypes.FLOAT
_LENGTH = struct.Struct("<I")
# Python's int() and float(), which read the values, take ``1_000``; no CSV writer puts it, and a type
# that took it and one that did not would read one file two ways.
_SEPARATOR = b"_"
_NOT_SPACE = re.compile(rb"\S")


def is_csv(content_type: str | None, body: RequestBody) -> bool:
    """A ``text/csv`` body, unless it is a JSON object (native reads a body of any type as JSON, and a row
    of numbers never starts with ``{``)."""
    if media_type(content_type) != CSV:
        return False
    first = _NOT_SPACE.search(body)
    return first is None or first.group() != b"{"


def wants_json_lines(accept: str | None) -> bool:
    return accept is not None and JSON_LINES in accept.lower()


@dataclass(frozen=True)
class CsvInput:
    """The one input a CSV row goes to: its name, Triton data type, the values a row has (None: any
    number, the same for every row of a body) and the rows one Triton request may carry."""

    name: str
    datatype: str
    width: int | None
    max_batch_size: int


def csv_input(model: str, config: dict[str, Any]) -> CsvInput:
    """The input CSV rows go to, from Triton's configuration of ``model``; 415 when it has none."""
    inputs = config.get("input")
    inputs = inputs if isinstance(inputs, list) else []
    max_batch_size = int(config.get("max_batch_size") or 0)
    takes = ", ".join(_described(spec, max_batch_size) for spec in inputs if isinstance(spec, dict))
    if max_batch_size > 0 and len(inputs) == 1 and isinstance(inputs[0], dict):
        spec = inputs[0]
        dims = [int(d) for d in spec.get("dims") or []]
        datatype = _datatype(spec)
        if len(dims) == 1 and datatype in NUMERIC:
            return CsvInput(str(spec.get("name")), datatype, None if dims[0] < 0 else dims[0], max_batch_size)
    raise UnsupportedMediaType(
        f"model '{model}' does not take text/csv: that needs exactly one numeric input of shape [batch, n] "
        f"(max_batch_size > 0), a row a line, and it takes {takes or 'no inputs'}"
        f"{'' if max_batch_size > 0 else ' without a batch dimension (max_batch_size 0)'}; "
        "send JSON Lines (application/jsonlines), one KServe v2 request a line, instead"
    )


def _datatype(spec: dict[str, Any]) -> str:
    try:
        return dtypes.from_config_type(str(spec.get("data_type")))
    except ValueError:
        return "?"


def _described(spec: dict[str, Any], max_batch_size: int) -> str:
    dims = [int(d) for d in spec.get("dims") or []]
    shape = ([-1] if max_batch_size > 0 else []) + dims
    return f"{spec.get('name')} ({_datatype(spec)} {shape})"


@dataclass(frozen=True)
class Rows:
    """Rows of a CSV body sent to Triton together: the first one's index and how many."""

    first: int
    count: int
    inference: Inference


def requests(body: RequestBody, to: CsvInput, parameters: dict[str, Any]) -> list[Rows]:
    """The Triton requests carrying the rows of a CSV body, at most ``max_batch_size`` rows each; 400
    naming the line for a row that is not ``n`` numbers."""
    values = parse(body, to)
    numpy_type = dtypes.numpy_dtype(to.datatype)
    batches = []
    for first in range(0, len(values), to.max_batch_size):
        rows = np.ascontiguousarray(values[first : first + to.max_batch_size], dtype=numpy_type)
        raw = rows.tobytes()
        header = {
            "inputs": [
                {
                    "name": to.name,
                    "shape": list(rows.shape),
                    "datatype": to.datatype,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {**parameters, "binary_data_output": True},
        }
        head = orjson.dumps(header)
        batches.append(Rows(first, len(rows), Inference(head + raw, len(head), header)))
    return batches


def parse(body: RequestBody, to: CsvInput) -> NDArray[Any]:
    """The rows of a CSV body as one array of ``to``'s numpy type, shape ``[rows, n]``, its values read as
    the module docstring says (the byte-order mark is Excel's: its UTF-8 exports begin with one)."""
    lines: list[bytes] = bytes(body).split(b"\n") if isinstance(body, bytearray) else body.split(b"\n")
    if lines[0].startswith(codecs.BOM_UTF8):
        lines[0] = lines[0][len(codecs.BOM_UTF8) :]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise BadRequest("the text/csv body holds no rows: send one row of numbers a line")
    numpy_type = dtypes.numpy_dtype(to.datatype)
    width = to.width
    rows: list[list[bytes]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise BadRequest(f"line {number} of {len(lines)}: {EMPTY_LINE.replace('KServe v2 request', 'row')}")
        fields = [field.strip().strip(b'"') for field in line.split(b",")]
        if width is None:
            width = len(fields)
        if len(fields) != width:
            expected = f"model input '{to.name}' takes {to.width}" if to.width else f"line 1 has {width}"
            raise BadRequest(f"line {number} of {len(lines)} has {len(fields)} values: {expected}")
        rows.append(fields)
    try:
        if _SEPARATOR in body:
            raise ValueError("a digit separator")
        return _values(np.array(rows, dtype=bytes), numpy_type)
    except (ValueError, OverflowError):
        for number, fields in enumerate(rows, 1):
            bad = next((f for f in fields if not _converts(f, numpy_type)), None)
            if bad is not None:
                plain = ": write plain decimal numbers, without digit separators" if _SEPARATOR in bad else ""
                raise BadRequest(
                    f"line {number} of {len(lines)}: {bad.decode('utf-8', 'replace')!r} is not a value of "
                    f"{to.datatype} (model input '{to.name}'){plain}"
                ) from None
        raise


def _values(text: NDArray[Any], numpy_type: np.dtype[Any]) -> NDArray[Any]:
    """Numbers from their text, refused (ValueError) out of the type's range rather than wrapped."""
    if numpy_type.kind == "f":
        return text.astype(numpy_type)
    if numpy_type.kind == "u" and np.char.startswith(text, b"-").any():
        raise ValueError("negative")
    wide = text.astype(np.uint64 if numpy_type.kind == "u" else np.int64)
    info = np.iinfo(numpy_type)
    if wide.size and (wide.min() < info.min or wide.max() > info.max):
        raise ValueError("out of range")
    return wide.astype(numpy_type)


def _converts(field: bytes, numpy_type: np.dtype[Any]) -> bool:
    if _SEPARATOR in field:
        return False
    try:
        _values(np.array([field], dtype=bytes), numpy_type)
    except (ValueError, OverflowError):
        return False
    return True


def lines(
    batches: Sequence[Rows],
    outcomes: Sequence[Outcome],
    to_answer: Callable[[UpstreamResponse], Answer],
    json_lines: bool,
    model_name: str,
) -> list[Line]:
    """Each row's answer line (CSV, or its KServe v2 response with ``json_lines``), in order; the rows of
    a failed Triton request each get its failure."""
    out: list[Line] = []
    for batch, outcome in zip(batches, outcomes, strict=True):
        failure = _failure(outcome, to_answer)
        if failure is None:
            assert isinstance(outcome, UpstreamResponse)
            try:
                out += _rows(outcome, batch.count, json_lines, model_name)
                continue
            except (ValueError, KeyError, TypeError, struct.error) as exc:  # an answer not as asked for
                failure = Failure(500, f"Triton's answer could not be read as rows: {exc}")
        if batch.count > 1:
            where = f"lines {batch.first + 1}-{batch.first + batch.count} went to Triton together"
            failure = Failure(failure.status, f"{failure.message} ({where})")
        out += [failure] * batch.count
    return out


def _failure(outcome: Outcome, to_answer: Callable[[UpstreamResponse], Answer]) -> Failure | None:
    if isinstance(outcome, ServeError):
        return Failure(outcome.status, outcome.message)
    if outcome.status == 200:
        return None
    status, _, payload = to_answer(outcome)
    return Failure(status, error_message(payload))


def outputs(upstream: UpstreamResponse) -> tuple[dict[str, Any], list[tuple[dict[str, Any], NDArray[Any]]]]:
    """Triton's answer (binary outputs, or JSON ones) as its header and each output's array."""
    end = upstream.header_length if upstream.header_length is not None else len(upstream.body)
    header = orjson.loads(upstream.body[:end])
    offset = end
    arrays = []
    for spec in header.get("outputs") or []:
        shape = [int(d) for d in spec["shape"]]
        datatype = str(spec["datatype"])
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is None:
            data = spec.get("data") or []
            array = np.array([v.encode() if isinstance(v, str) else v for v in data], dtype=_numpy_type(datatype))
        else:
            raw = upstream.body[offset : offset + int(size)]
            offset += int(size)
            array = _bytes_elements(raw) if datatype == "BYTES" else np.frombuffer(raw, dtype=_numpy_type(datatype))
        arrays.append((spec, array.reshape(shape)))
    return header, arrays


def _numpy_type(datatype: str) -> np.dtype[Any]:
    return dtypes.numpy_dtype(datatype)


def _bytes_elements(raw: bytes) -> NDArray[Any]:
    elements = []
    at = 0
    while at < len(raw):
        (length,) = _LENGTH.unpack_from(raw, at)
        elements.append(raw[at + 4 : at + 4 + length])
        at += 4 + length
    return np.array(elements, dtype=object)


def _rows(upstream: UpstreamResponse, count: int, json_lines: bool, model_name: str) -> list[bytes]:
    header, arrays = outputs(upstream)
    for spec, array in arrays:
        if not array.shape or array.shape[0] != count:
            raise ValueError(f"output '{spec.get('name')}' has shape {list(array.shape)}, not [{count}, ...]")
    if json_lines:
        version = header.get("model_version", "1")
        return [
            orjson.dumps(
                {
                    "model_name": model_name,
                    "model_version": version,
                    "outputs": [
                        {
                            "name": spec["name"],
                            "datatype": spec["datatype"],
                            "shape": [1, *array.shape[1:]],
                            "data": _json_data(array[row]),
                        }
                        for spec, array in arrays
                    ],
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            for row in range(count)
        ]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="")
    lines = []
    for row in range(count):
        text.seek(0)
        text.truncate()
        writer.writerow([_cell(value) for _, array in arrays for value in array[row].reshape(-1)])
        lines.append(text.getvalue().encode())
    return lines


def _json_data(values: NDArray[Any]) -> Any:
    flat = values.reshape(-1)
    if flat.dtype == object:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in flat]
    return flat


def _cell(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
