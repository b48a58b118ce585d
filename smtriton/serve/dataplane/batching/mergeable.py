"""One inference request as a merge takes it (:func:`part`: a :class:`Part`), or None: it goes alone.

Requests of a model that may merge (:mod:`~smtriton.serve.dataplane.batching.rule`) merge when they agree
on input names, datatypes, non-batch dimensions and encodings, on the outputs they ask for and on their
parameters, carry no sequence, priority, timeout or custom-attribute parameter, and together fit
``max_batch_size``. Every size a request declares is checked here as Triton would check it alone (JSON
element counts, binary byte counts, BYTES framing), so that two wrong requests can never add up to a
right-looking merged one. Anything else goes alone. A JSON input's data is kept as the client's own text
(:func:`_tensors`), which the merge joins (:mod:`~smtriton.serve.dataplane.batching.merging`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import orjson

from smtriton.serve.dataplane.answers import CUSTOM_ATTRIBUTES
from smtriton.serve.dataplane.batching.json_text import (
    SPACE,
    NotPlain,
    scalar_data,
    value_end,
    walk_array,
    walk_object,
)
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading.codec import DATA_ELSEWHERE
from smtriton.serve.dataplane.reading.inference import KNOWN_HEADER_BYTES, KNOWN_HEADERS, Inference
from smtriton.serve.triton.input_arena import ITEM_BYTES
from smtriton.serve.triton.request_body import contiguous

# Request parameters that make a request its own: its place in a sequence, how Triton schedules it,
# what the model reads for this client alone.
ALONE_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", CUSTOM_ATTRIBUTES}
)
# Parameters that put an input's data, or an output, in shared memory rather than the request or answer.
_SHARED_MEMORY = frozenset(DATA_ELSEWHERE) - {"binary_data_size"}
# A merged body stays below this: Triton refuses an HTTP body past its --http-max-input-size (64 MB).
MERGED_BYTES_MAX = 32 * 1024 * 1024
_LENGTH = struct.Struct("<I")


# Per input of a part: the JSON data's text inside its brackets, or where its bytes lie in the body.
Tensor = bytes | tuple[int, int]


@dataclass(frozen=True, slots=True, eq=False)
class Part:
    """One request as a merge takes it: ``key`` is equal for requests that may merge, ``batch`` is its
    rows, ``tensors`` each input's data."""

    inference: Inference
    key: Hashable
    batch: int
    request_id: str | None
    tensors: tuple[Tensor, ...]
    spans: list[tuple[int, int]] | None = None  # where a JSON request's data lies inside its brackets

    @property
    def size(self) -> int:
        return len(self.inference.body)


class _Alone(NotPlain):
    """The request goes to Triton alone."""


# What a part is made of beside its request: its key, rows, id and tensors.
_Made = tuple[Hashable, int, str | None, tuple[Tensor, ...]]
# A small binary request's header is one object shared by every request that sent the same JSON part
# (the reading keeps it), and so is what a part is made of while the body's length and the model's
# largest batch are the same, unless a BYTES input's framing (read in the body) is checked: kept beside
# the header it came from (held here, so that its id names no other while kept), the 19 µs of
# :func:`_part` become a look-up.
_made: dict[int, tuple[dict[str, Any], tuple[int, int, int], _Made]] = {}
# A small JSON request repeats too, but for its numbers: what a part is made of but its data is kept for
# the text around its inputs' data (:func:`scalar_data`, checked once against the walk of
# :func:`_data_texts`), with each input's element count, which the data's commas must then add up to.
_made_json: dict[tuple[tuple[str, ...], int], tuple[Hashable, int, str | None, tuple[int, ...]]] = {}
_JSON_TEXT_MAX = 4096  # the longest text around the data kept


def part(inference: Inference, model: ModelBatching) -> Part | None:
    """``inference`` ready to be merged with others of its model, or None when it goes alone."""
    header = inference.header
    length = inference.header_length
    if header is None or length == 0 or not inference.complete:
        return None
    if len(inference.body) > MERGED_BYTES_MAX:
        return None  # no merged request holds it: it goes alone, its body never joined here
    if length is None:
        return _json_part(inference, header, model)
    sizes = None
    if length <= KNOWN_HEADER_BYTES:  # (a JSON request went to _json_part above)
        sizes = (length, len(inference.body), model.max_batch_size)
        known = _made.get(id(header))
        if known is not None and known[0] is header and known[1] == sizes:
            return Part(inference.whole(), *known[2])
    inference = inference.whole()  # its body is read here and copied into the merged one: as one buffer
    try:
        made = _part(inference, header, model)
    except (NotPlain, TypeError, ValueError, KeyError, IndexError, AttributeError):
        return None  # anything unexpected: Triton answers the request alone, in its own words
    if sizes is not None and all(spec["datatype"] != "BYTES" for spec in header["inputs"]):
        if len(_made) >= KNOWN_HEADERS:
            _made.clear()
        _made[id(header)] = (header, sizes, (made.key, made.batch, made.request_id, made.tensors))
    return made


def _json_part(inference: Inference, header: dict[str, Any], model: ModelBatching) -> Part | None:
    """:func:`part` of a JSON request: its part kept for the text around its data, or made (and kept)."""
    text = bytes(contiguous(inference.body)).decode("utf-8", "surrogateescape")  # the reading checked it
    spans, around = scalar_data(text)
    known = _made_json.get((around, model.max_batch_size))
    if known is None:
        try:
            made = _part(inference, header, model, text)
        except (NotPlain, TypeError, ValueError, KeyError, IndexError, AttributeError):
            return None  # anything unexpected: Triton answers the request alone, in its own words
        if made.spans == spans and sum(map(len, around)) <= _JSON_TEXT_MAX:
            if len(_made_json) >= KNOWN_HEADERS:
                _made_json.clear()
            counts = tuple(math.prod(spec["shape"]) for spec in header["inputs"])
            _made_json[(around, model.max_batch_size)] = (made.key, made.batch, made.request_id, counts)
        return made
    key, batch, request_id, counts = known
    tensors = []
    for (start, stop), count in zip(spans, counts, strict=True):
        inner = text[start:stop].strip(SPACE)
        if (inner.count(",") + 1 if inner else 0) != count:
            return None  # Triton counts the elements itself, for this request alone
        tensors.append(inner.encode("utf-8", "surrogateescape"))
    return Part(inference, key, batch, request_id, tuple(tensors))


def _part(inference: Inference, header: dict[str, Any], model: ModelBatching, text: str | None = None) -> Part:
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _Alone
    parameters = header.get("parameters", {})
    if not _plain(parameters) or not ALONE_PARAMETERS.isdisjoint(parameters):
        raise _Alone
    inputs = header["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise _Alone
    binary = inference.header_length is not None
    offset = inference.header_length or 0
    signature: list[tuple[Any, ...]] = []
    places: list[tuple[int, int] | None] = []
    for spec in inputs:
        name, shape, sent = _input(spec, inference, offset)
        if sent is not None:
            offset += sent[1]
        if shape[0] != inputs[0]["shape"][0] or any(name == earlier[0] for earlier in signature):
            raise _Alone
        others = {key: value for key, value in spec.get("parameters", {}).items() if key != "binary_data_size"}
        signature.append((name, spec["datatype"], tuple(shape[1:]), sent is not None, _canonical(others)))
        places.append(sent)
    batch = inputs[0]["shape"][0]
    if not 0 < batch <= model.max_batch_size or offset != (len(inference.body) if binary else 0):
        raise _Alone
    outputs = requested_outputs(header["outputs"]) if "outputs" in header else None
    spans: list[tuple[int, int]] = []
    tensors = _tensors(inference, places, spans, text) if None in places else places
    key = (binary, tuple(signature), _canonical(outputs), _canonical(parameters))
    return Part(inference, key, batch, request_id or None, tuple(tensors), spans)  # type: ignore[arg-type]


def _input(spec: dict[str, Any], inference: Inference, offset: int) -> tuple[str, list[int], tuple[int, int] | None]:
    """An input's name and shape, and where its bytes lie (None: its data is JSON), each checked as Triton
    checks them alone."""
    name, datatype, shape = spec["name"], spec["datatype"], spec["shape"]
    if not isinstance(name, str) or not (datatype in ITEM_BYTES or datatype == "BYTES"):
        raise _Alone
    if not isinstance(shape, list) or not shape or not all(type(d) is int and d >= 0 for d in shape):
        raise _Alone
    parameters = spec.get("parameters", {})
    if not _plain(parameters) or not _SHARED_MEMORY.isdisjoint(parameters):
        raise _Alone
    size = parameters.get("binary_data_size")
    elements = math.prod(shape)
    if size is None:
        if datatype in ("FP16", "BF16") or _count(spec.get("data")) != elements:
            raise _Alone  # Triton takes no half floats in JSON, and counts the elements itself
        return name, shape, None
    if inference.header_length is None or "data" in spec or type(size) is not int or size < 0:
        raise _Alone
    if not _fits(datatype, elements, inference.body, offset, size):
        raise _Alone
    return name, shape, (offset, size)


def _plain(parameters: Any) -> bool:
    """Parameters whose values are written back exactly: strings, integers and booleans (a float's text
    could be read back otherwise by Triton's parser)."""
    return isinstance(parameters, dict) and all(type(v) in (str, int, bool) for v in parameters.values())


def _canonical(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # a lone surrogate in a string, say
        raise _Alone from None


def requested_outputs(outputs: Any) -> list[dict[str, Any]]:
    """The requested outputs as Triton reads them (name and parameters); one sent elsewhere than the
    answer (shared memory) keeps the request alone."""
    if not isinstance(outputs, list):
        raise _Alone
    read = []
    for output in outputs:
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise _Alone
        entry = {"name": output["name"]}
        if "parameters" in output:
            parameters = output["parameters"]
            if not _plain(parameters) or not _SHARED_MEMORY.isdisjoint(parameters):
                raise _Alone
            entry["parameters"] = parameters
        read.append(entry)
    return read


def _count(data: Any) -> int:
    """Elements of a JSON tensor's data as Triton counts them (nested lists flattened); -1 if it is no list."""
    if not isinstance(data, list):
        return -1
    if list not in map(type, data):  # flat, as clients mostly send it
        return len(data)
    count = 0
    for item in data:
        inner = _count(item) if type(item) is list else 1
        if inner < 0:
            return -1
        count += inner
    return count


def _fits(datatype: str, elements: int, body: Any, offset: int, size: int) -> bool:
    """Whether ``size`` bytes at ``offset`` are exactly ``elements`` elements of ``datatype``."""
    if offset + size > len(body):
        return False
    item = ITEM_BYTES.get(datatype)
    if item is not None:
        return size == elements * item
    end, count = offset + size, 0
    while offset < end:
        if offset + 4 > end:
            return False
        offset += 4 + _LENGTH.unpack_from(body, offset)[0]
        count += 1
    return offset == end and count == elements


# ----- the JSON data's own text --------------------------------------------------------------------------
def _tensors(
    inference: Inference, places: list[tuple[int, int] | None], spans: list[tuple[int, int]], text: str | None
) -> list[Tensor]:
    """``places`` with each JSON input's ``data`` text, inside its brackets, in place of None; where each
    lies (inside its brackets) put in ``spans``. ``text``: the request's JSON part, if decoded already."""
    if text is None:
        body = contiguous(inference.body)
        json_part = body if inference.header_length is None else body[: inference.header_length]
        text = bytes(json_part).decode("utf-8", "surrogateescape")  # the reading checked that it is UTF-8
    found_at = _data_texts(text)
    if len(found_at) != len(places):
        raise _Alone
    tensors: list[Tensor] = []
    for place, at in zip(places, found_at, strict=True):
        if place is not None:
            tensors.append(place)
        elif at is None or not (text[at[0]] == "[" and text[at[1] - 1] == "]"):
            raise _Alone
        else:
            spans.append((at[0] + 1, at[1] - 1))
            tensors.append(text[at[0] + 1 : at[1] - 1].strip(SPACE).encode("utf-8", "surrogateescape"))
    return tensors


def _data_texts(text: str) -> list[tuple[int, int] | None]:
    """Where each input's ``data`` value lies in a request's JSON (None for an input without): the
    reading refused repeated keys, so each is the one Triton reads."""
    found: list[tuple[int, int] | None] = []

    def data_of(key: str, start: int) -> int:
        end = value_end(text, start)
        if key == "data":
            found[-1] = (start, end)
        return end

    def inputs(key: str, start: int) -> int:
        if key != "inputs":
            return value_end(text, start)

        def one_input(at: int) -> int:
            found.append(None)
            return walk_object(text, at, data_of)

        return walk_array(text, start, one_input)

    walk_object(text, 0, inputs)
    return found
