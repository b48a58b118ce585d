"""Triton's answer to a merged request, cut by rows from its own text: each client's answer is Triton's
answer with its ``id`` first, its outputs' shapes and ``binary_data_size`` and its rows of each output
in place of the whole request's — the JSON data of its rows the very characters Triton wrote, binary
outputs the very bytes — so it is byte for byte what its request gets alone. Anything that cannot be
cut so (an output without the batch dimension first and then its declared dims, sizes that do not add
up) raises :class:`~smtriton.serve.dataplane.batching.json_text.NotPlain`."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smtriton.serve.dataplane.batching.json_text import (
    SPACE,
    NotPlain,
    scalar_data,
    scanstring,
    skip,
    value_end,
    walk_array,
    walk_object,
)
from smtriton.serve.triton.client import UpstreamResponse
from smtriton.serve.triton.input_arena import ITEM_BYTES

# Each output's dims after the batch dimension, as a model's configuration declares them (-1: any size).
Declared = tuple[tuple[str, tuple[int, ...]], ...]
_LENGTH = struct.Struct("<I")
# A shape and a size as Triton writes them in an answer: compact, non-negative integers.
_SHAPE = re.compile(r"\[((?:[0-9]{1,18}(?:,[0-9]{1,18})*)?)\]")
_DIGITS = re.compile(r"[0-9]{1,18}")


@dataclass(slots=True)
class _OutputText:
    """Where one output's members lie in the text of Triton's answer."""

    name: str = ""
    datatype: str = ""
    shape: list[int] = field(default_factory=list)
    shape_at: tuple[int, int] = (0, 0)
    data_at: tuple[int, int] | None = None
    size: int | None = None  # binary_data_size
    size_at: tuple[int, int] = (0, 0)


def _answer_layout(text: str) -> list[_OutputText]:
    """Each output's shape, data and binary size, and where their text lies; an ``id`` (the merged
    request has none) or an answer that is not Triton's plain form raises :class:`NotPlain`."""
    outputs: list[_OutputText] = []

    def one_output(at: int) -> int:
        output = _OutputText()
        outputs.append(output)
        return walk_object(text, at, lambda key, start: _output_member(text, output, key, start))

    def top(key: str, start: int) -> int:
        if key == "id":
            raise NotPlain
        return walk_array(text, start, one_output) if key == "outputs" else value_end(text, start)

    if walk_object(text, 0, top) != len(text):
        raise NotPlain  # (Triton writes nothing around its object)
    return outputs


def _output_member(text: str, output: _OutputText, key: str, start: int) -> int:
    """Note one member of an output of Triton's answer; its end."""
    if key == "data":
        if text[start] != "[":
            raise NotPlain
        # numbers, booleans and NaN as Triton writes them hold no bracket: no need to parse them
        end = text.index("]", start) + 1 if output.datatype not in ("", "BYTES") else value_end(text, start)
        output.data_at = (start, end)
        return end
    if key in ("name", "datatype"):
        if text[start] != '"':
            raise NotPlain
        value, end = scanstring(text, start + 1)
        if key == "name":
            output.name = value
        else:
            output.datatype = value
        return end
    if key == "shape":
        found = _SHAPE.match(text, start)
        if found is None:
            raise NotPlain
        inside = found.group(1)
        output.shape, output.shape_at = [int(d) for d in inside.split(",")] if inside else [], found.span()
        return found.end()
    if key == "parameters":
        return walk_object(text, start, lambda name, at: _parameter_member(text, output, name, at))
    return value_end(text, start)


def _parameter_member(text: str, output: _OutputText, key: str, start: int) -> int:
    if key != "binary_data_size":
        return value_end(text, start)
    found = _DIGITS.match(text, start)
    if found is None:
        raise NotPlain
    output.size, output.size_at = int(found.group()), found.span()
    return found.end()


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one answer of Triton's is cut: each part's answer text after its opening brace, as literal
    text around holes for its rows of each JSON output's data (its shapes and sizes in place), and where
    each part's binary outputs lie in the body."""

    literals: list[list[str]]  # per part: the text before each hole, and after the last
    holes: list[tuple[str, int]]  # per JSON data output, in the text's order: its datatype, values a row
    spans: list[tuple[int, int]]  # where each hole's data lies inside its brackets in the answer planned
    ranges: list[list[tuple[int, int]]]  # after the header
    more: bool  # members follow the opening brace: an id goes before them with a comma
    binary_length: int  # of what follows the header
    reusable: bool  # it depends on the text around the JSON data alone (binary outputs of fixed-size items)
    plain: list[bytes]  # without holes: each part's answer text, encoded, for a part without an id


# A plan for the same text around the JSON data (a header repeats; so does a JSON answer's but for its
# numbers) for the same rows of the same model: kept, so that an answer is walked once, not once per
# merged request. A plan is kept only where :func:`scalar_data` finds exactly the data the walk found.
_plans: dict[tuple[tuple[str, ...], tuple[int, ...], Declared | None], _Plan] = {}
_PLANS_MAX = 256
_PLAN_TEXT_MAX = 4096


def split(
    response: UpstreamResponse, rows: tuple[int, ...], ids: Sequence[str | None], declared: Declared | None
) -> list[UpstreamResponse]:
    """Each part's answer, for parts of ``rows`` rows and ``ids``; ``declared``: the model's outputs (None:
    not known, and the rows are then checked by count alone)."""
    body = response.body
    end = len(body) if response.header_length is None else response.header_length
    text = bytes(body[:end]).decode("utf-8", "surrogateescape")  # a BYTES output as the model made it
    spans, around = scalar_data(text)
    key = (around, rows, declared)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(text, body, end, rows, declared)
        if plan.reusable and plan.spans == spans and sum(map(len, around)) <= _PLAN_TEXT_MAX:
            if len(_plans) >= _PLANS_MAX:
                _plans.clear()
            _plans[key] = plan
        spans = plan.spans
    if plan.binary_length != len(body) - end:
        raise NotPlain
    cuts = [
        _text_cuts(text[start:stop], datatype, rows, per_row)
        for (start, stop), (datatype, per_row) in zip(spans, plan.holes, strict=True)
    ]
    answers = []
    for index, request_id in enumerate(ids):
        if plan.plain and not request_id:
            encoded = plan.plain[index]
        else:
            literals = plan.literals[index]
            texts = ['{"id":', _json_string(request_id), ","] if request_id else ["{"]
            if request_id and not plan.more:
                texts.pop()
            for hole, literal in enumerate(literals[:-1]):
                texts += [literal, cuts[hole][index]]
            texts.append(literals[-1])
            encoded = "".join(texts).encode("utf-8", "surrogateescape")
        if response.header_length is None:
            answers.append(UpstreamResponse(200, response.content_type, None, encoded))
        else:
            whole = memoryview(body)
            tensors = [whole[end + start : end + stop] for start, stop in plan.ranges[index]]
            answers.append(UpstreamResponse(200, response.content_type, len(encoded), b"".join([encoded, *tensors])))
    return answers


def _plan(text: str, body: Any, end: int, rows: tuple[int, ...], declared_outputs: Declared | None) -> _Plan:
    """Cut Triton's answer (its header ``text``, its ``body``) at the parts' ``rows``."""
    outputs = _answer_layout(text)
    total = sum(rows)
    declared = dict(declared_outputs) if declared_outputs is not None else None
    byte_cuts: dict[int, list[tuple[int, int]]] = {}  # per binary output: where each part's bytes lie
    per_row: dict[int, int] = {}
    offset = end
    reusable = True
    for n, output in enumerate(outputs):
        shape = output.shape
        if not shape or shape[0] != total:
            raise NotPlain
        if declared is not None and not _as_declared(shape, declared.get(output.name)):
            raise NotPlain  # the first dimension may be something else that happens to equal the rows
        per_row[n] = math.prod(shape[1:])
        if output.size is None:
            if output.data_at is None:
                raise NotPlain
        else:
            if output.data_at is not None or offset + output.size > len(body):
                raise NotPlain
            byte_cuts[n] = _byte_cuts(output.datatype, body, offset, output.size, rows, per_row[n])
            reusable = reusable and output.datatype != "BYTES"
            offset += output.size
    if offset != len(body):
        raise NotPlain
    # Each part's answer: Triton's text with its own shapes and sizes, and holes for its data.
    places = sorted(
        [(o.shape_at, n, "shape") for n, o in enumerate(outputs)]
        + [(o.data_at, n, "data") for n, o in enumerate(outputs) if o.data_at is not None]
        + [(o.size_at, n, "size") for n, o in enumerate(outputs) if o.size is not None]
    )
    holes = [(outputs[n].datatype, per_row[n]) for _, n, what in places if what == "data"]
    spans = [(start + 1, stop - 1) for (start, stop), _, what in places if what == "data"]
    literals, ranges = [], []
    for index, part_rows in enumerate(rows):
        texts: list[str] = []
        mine: list[tuple[int, int]] = []
        literal, at = [], 1
        for (start, stop), n, what in places:
            literal.append(text[at:start])
            if what == "shape":
                literal.append("[" + ",".join(map(str, [part_rows, *outputs[n].shape[1:]])) + "]")
            elif what == "data":
                texts.append("".join([*literal, "["]))
                literal = ["]"]
            else:
                piece = byte_cuts[n][index]
                literal.append(str(piece[1] - piece[0]))
                mine.append((piece[0] - end, piece[1] - end))
            at = stop
        literal.append(text[at:])
        texts.append("".join(literal))
        literals.append(texts)
        ranges.append(mine)
    plain = [("{" + texts[0]).encode("utf-8", "surrogateescape") for texts in literals] if not holes else []
    more = skip(text, 1) < len(text) - 1
    return _Plan(literals, holes, spans, ranges, more, len(body) - end, reusable, plain)


def _as_declared(shape: list[int], dims: tuple[int, ...] | None) -> bool:
    """Whether an output's shape is the batch dimension and then the dims its configuration declares."""
    if dims is None or len(shape) != len(dims) + 1:
        return False
    return all(want == -1 or want == got for want, got in zip(dims, shape[1:], strict=True))


def _text_cuts(inner: str, datatype: str, rows: tuple[int, ...], per_row: int) -> list[str]:
    """A JSON output's data text (inside its brackets) cut after each part's rows: Triton's own
    characters for each value."""
    if datatype == "BYTES":
        ends = _string_ends(inner)
    elif len(inner) <= 4096:  # no value holds a comma: the commas are the boundaries
        values = inner.split(",") if inner else []
        if len(values) != sum(rows) * per_row:
            raise NotPlain
        cuts, at = [], 0
        for part_rows in rows:
            cuts.append(",".join(values[at : at + part_rows * per_row]))
            at += part_rows * per_row
        return cuts
    else:  # the same, the commas found at once
        if not inner.isascii():
            raise NotPlain
        ends = np.flatnonzero(np.frombuffer(inner.encode("ascii"), np.uint8) == 44).tolist()
        ends.append(len(inner))
        if not inner:
            ends = []
    if len(ends) != sum(rows) * per_row:
        raise NotPlain
    cuts, at, count = [], 0, 0
    for part_rows in rows:
        count += part_rows * per_row
        stop = ends[count - 1] if count else 0
        cuts.append(inner[at:stop].strip(SPACE))
        at = stop + 1
    return cuts


def _string_ends(inner: str) -> list[int]:
    """Where each string of a JSON array's inside ends (its comma, or the end)."""
    ends: list[int] = []
    at = skip(inner, 0)
    while at < len(inner):
        if inner[at] != '"':
            raise NotPlain
        at = skip(inner, scanstring(inner, at + 1)[1])
        if at < len(inner) and inner[at] != ",":
            raise NotPlain
        ends.append(at)
        at = skip(inner, at + 1)
    return ends


def _json_string(value: str) -> str:
    """``value`` as Triton writes a string: only the quote, the backslash and control characters escaped
    (the short escapes where JSON has them, else ``\\u00XX`` with capital hex digits)."""
    if value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if c < " " else c) for c in value) + '"'


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _byte_cuts(
    datatype: str, body: Any, offset: int, size: int, rows: tuple[int, ...], per_row: int
) -> list[tuple[int, int]]:
    """Where each part's rows of a binary output lie: ``size`` bytes at ``offset`` of ``body``."""
    item = ITEM_BYTES.get(datatype)
    out, at, end = [], offset, offset + size
    if item is not None:
        if size != sum(rows) * per_row * item:
            raise NotPlain
        for count in rows:
            out.append((at, at + count * per_row * item))
            at += count * per_row * item
        return out
    if datatype != "BYTES":
        raise NotPlain
    for count in rows:
        start = at
        for _ in range(count * per_row):
            if at + 4 > end:
                raise NotPlain
            at += 4 + _LENGTH.unpack_from(body, at)[0]
        out.append((start, at))
    if at != end:
        raise NotPlain
    return out
