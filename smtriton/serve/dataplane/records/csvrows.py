"""``text/csv`` bodies: one row of a model's one numeric input a line (docs/contract.md §7).

This is what SageMaker's built-in algorithms and most tabular batch transform jobs send. A model takes it
when it has exactly one input, numeric, of shape ``[batch, n]`` (``max_batch_size > 0``): every line of the
body is a row of ``n`` values, all rows go in one tensor (read and checked before any row is sent, by one
rule for every type: :mod:`~smtriton.serve.dataplane.records.csv_values`), split into Triton requests of at most
``max_batch_size`` rows (binary, with binary outputs asked for), each made when it is its turn. The answer
has one line per row, in order: ``text/csv``, the row's values of every output in the order Triton gives
them, flattened; or, with ``Accept: application/jsonlines``, the row's KServe v2 response (each output's
shape with a batch of 1). Any other model is refused with 415 saying what it takes. A failing request
fails its rows as :mod:`~smtriton.serve.dataplane.records.record_answers` says; a Triton restart costs them time
only, each request going as a single stateless one does (``Work.send``), the rows already answered kept.
"""

from __future__ import annotations

import csv
import functools
import io
import re
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from smtriton import dtypes
from smtriton.serve.dataplane.answers import JSON_LINES, Answer
from smtriton.serve.dataplane.reading.codec import media_type
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.dataplane.records import record_answers
from smtriton.serve.dataplane.records.csv_values import CsvInput, read
from smtriton.serve.dataplane.records.record_answers import Failure, Line, Outcome, error_message
from smtriton.serve.dataplane.request import Reply
from smtriton.serve.errors import ServeError, UnsupportedMediaType
from smtriton.serve.triton.client import RequestBody, UpstreamResponse

CSV = "text/csv"
NUMERIC = dtypes.INTEGER | dtypes.FLOAT
_LENGTH = struct.Struct("<I")
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


@dataclass(frozen=True, slots=True)
class Work:
    """How a body's rows go to Triton and come back: the sending, Triton's answer made SageMaker's, whether
    a failure is written as an error line, the Triton requests in flight at most, the answer's form (each
    row's KServe v2 response with ``json_lines``, else CSV) and model name, and the parameters each request
    carries (the custom attributes)."""

    send: Callable[[Inference], Awaitable[UpstreamResponse]]
    to_answer: Callable[[UpstreamResponse], Answer]
    error_lines: bool
    in_flight: int
    json_lines: bool
    model_name: str
    parameters: dict[str, Any]


async def answer(body: RequestBody, to: CsvInput, work: Work) -> Reply:
    """The answer to a CSV body: every row read and checked (400 naming the line), then sent in requests of
    at most ``max_batch_size`` rows, each made when it is its turn, a bounded number at a time; a line a
    row, written in order as they come (:mod:`~smtriton.serve.dataplane.records.record_answers`)."""
    values = await read(body, to)
    out = record_answers.AnswerBuffer(len(values), work.error_lines)
    firsts = range(0, len(values), to.max_batch_size)
    jobs = (functools.partial(_send, values, first, to, work, out) for first in firsts)
    await record_answers.run_window(iter(jobs), work.in_flight, lambda: out.stopped)
    await out.finish()
    return out.reply(JSON_LINES if work.json_lines else CSV)


async def _send(values: NDArray[Any], first: int, to: CsvInput, work: Work, out: record_answers.AnswerBuffer) -> None:
    count = min(to.max_batch_size, len(values) - first)
    outcome: Outcome
    try:
        outcome = await work.send(request(values[first : first + count], to, work.parameters))
    except ServeError as exc:
        outcome = exc
    for row, line in enumerate(lines(first, count, outcome, work.to_answer, work.json_lines, work.model_name)):
        out.put(first + row, line)


def request(rows: NDArray[Any], to: CsvInput, parameters: dict[str, Any]) -> Inference:
    """The Triton request carrying ``rows`` (binary, with binary outputs asked for)."""
    raw = np.ascontiguousarray(rows).tobytes()
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
    return Inference(head + raw, len(head), header)


def lines(
    first: int,
    count: int,
    outcome: Outcome,
    to_answer: Callable[[UpstreamResponse], Answer],
    json_lines: bool,
    model_name: str,
) -> list[Line]:
    """The answer lines of the ``count`` rows from ``first`` that went to Triton together (CSV, or each
    row's KServe v2 response with ``json_lines``); the rows of a failed request each get its failure."""
    failed = _failure(outcome, to_answer)
    if failed is None:
        assert isinstance(outcome, UpstreamResponse)
        try:
            return list(_rows(outcome, count, json_lines, model_name))
        except (ValueError, KeyError, TypeError, struct.error) as exc:  # an answer not as asked for
            failed = record_answers.failure(500, f"Triton's answer could not be read as rows: {exc}")
    if count > 1:
        where = f"lines {first + 1}-{first + count} went to Triton together"
        failed = record_answers.failure(failed.status, f"{failed.message} ({where})")
    return [failed] * count


def _failure(outcome: Outcome, to_answer: Callable[[UpstreamResponse], Answer]) -> Failure | None:
    if isinstance(outcome, ServeError):
        return record_answers.failure(outcome.status, outcome.message)
    if outcome.status == 200:
        return None
    status, _, payload = to_answer(outcome)
    return record_answers.failure(status, error_message(payload))


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
