"""The one reading of an inference request: what the front checks is what Triton will read.

Triton reads a request's JSON with rapidjson: of a key repeated in one object the *first* value counts,
``NaN`` and ``Infinity`` are numbers, an integer past 64 bits becomes a double and text that is not
UTF-8 passes. Python's readers differ (orjson keeps the *last* of a repeated key and refuses ``NaN``), so
a check made on one reading could be walked around by a request that the other reads otherwise: a
repeated ``"shape"`` whose first value lies about the request's size made Triton allocate 14 GB. So a
request is read here once, strictly, and every part of the front that needs a value of it — the size
checks below, the sessions, the sequence range, the parameters the front adds, the re-encoding of large
JSON, the gRPC stream — takes it from this reading. A document the two could read differently is
refused with 400 before Triton sees it: a key repeated in one object, a ``NaN`` or ``Infinity``
literal, an integer past 64 bits, text that is not UTF-8, JSON that does not parse (docs/contract.md
§3.4 says why refusing beats forwarding a re-encoding).

What the reading refuses because it would crash Triton:

- JSON nested deeper than :data:`MAX_JSON_DEPTH` levels: Triton's parser is recursive, and a body a few
  hundred thousand levels deep overflows its stack (nothing a model takes nests beyond about 12);
- an input whose shape declares more elements than its JSON could carry (one byte each at the least):
  Triton allocates by the declared shape before it reads the data (``"shape": [899970039, 4]`` in a
  100-byte request, 14 GB); inputs whose data lies elsewhere (binary data after the JSON, or shared
  memory) are sized by Triton against their shape before it allocates, and may not carry JSON data too;
- a shape that is not a list of non-negative integers below 2**63.

Like Triton, the reading takes the JSON part's first value and ignores what follows it.

Small JSON parts are read by the standard library's parser (it reports a repeated key through its
object hook and refuses ``NaN`` through its constant hook); large ones by simdjson, which builds no
Python object for the tensor data and is what the re-encoding of large JSON reads too.

A binary request's JSON part names its tensors and says where their bytes lie, not what they hold, so
a client sends the same few again and again: each is read and checked once, and its reading kept,
found again by its bytes (a worker keeps :data:`KNOWN_HEADERS` of them, each at most
:data:`KNOWN_HEADER_BYTES` long). The reading of the tiny benchmark's part cost 16 µs, a sixth of the
front's Python for the request; finding it costs a hash of its bytes. A header so kept is shared by
every request that sent it: no part of the front changes a header it was given.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import orjson
import simdjson

from smtriton.serve.dataplane.reading import codec, transcode
from smtriton.serve.errors import BadRequest
from smtriton.serve.triton import input_arena
from smtriton.serve.triton.client import RequestBody
from smtriton.serve.triton.request_body import BodyPieces, HeldBody

# simdjson's own maximum depth: the parse that checks a body stops there.
MAX_JSON_DEPTH = 1024
# JSON parts up to this size are read into Python objects whole; larger ones by simdjson, their inputs'
# data left where it is.
SMALL_JSON = 16 * 1024
_INT_MIN, _UINT_END = -(1 << 63), 1 << 64
_SHAPE_END = 1 << 63
KNOWN_HEADERS = 256  # binary JSON parts whose reading a worker keeps (all forgotten when it is full)
KNOWN_HEADER_BYTES = 4096  # the longest kept
_known: dict[bytes, dict[str, Any]] = {}


class JsonTooDeep(BadRequest):
    def __init__(self) -> None:
        super().__init__(f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")


class Unreadable(BadRequest):
    """A body that is not one JSON document the front and Triton read alike."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"failed to parse the request JSON buffer: {reason}; {codec.ACCEPTED_BODIES}")


class RepeatedKey(BadRequest):
    def __init__(self, key: str) -> None:
        super().__init__(
            f"the request's JSON repeats the key {json.dumps(key)} in one object: each key may appear once"
        )


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise Unreadable(f"{name} is not a JSON number")


_SMALL_READER = json.JSONDecoder(object_pairs_hook=_unique_object, parse_constant=_no_constant)
_JSON_SPACE = " \t\n\r"


@dataclass(slots=True)
class Inference:
    """An inference request as the front read it, and as Triton will: ``body`` and ``header_length`` as
    they go to Triton (None: the whole body is JSON; 0: raw, the body is the one input's bytes), and
    ``header``, the JSON part's values (None in raw mode), read-only: a binary request's is shared with
    the others that sent the same JSON part. ``complete`` is False for a large JSON body whose inputs'
    ``data`` were left out of ``header``."""

    body: HeldBody  # a binary request's body may be held in the pieces it arrived in
    header_length: int | None
    header: dict[str, Any] | None
    complete: bool = True

    @property
    def parameters(self) -> dict[str, Any]:
        """The request's own parameters (empty when it has none)."""
        parameters = self.header.get("parameters") if self.header is not None else None
        return parameters if isinstance(parameters, dict) else {}

    def whole_header(self) -> dict[str, Any] | None:
        """``header`` with every input's data (read again from the body where it was left out)."""
        if self.complete or self.header is None:
            return self.header
        whole: dict[str, Any] = orjson.loads(_json_part(self.body, self.header_length))  # checked above
        return whole

    def whole(self) -> Inference:
        """The request with its body in one buffer (joined, once, if it was held in pieces)."""
        if not isinstance(self.body, BodyPieces):
            return self
        return Inference(self.body.joined(), self.header_length, self.header, self.complete)

    def with_parameters(self, values: dict[str, Any]) -> Inference:
        """The request with ``parameters[key]`` set for each of ``values``: its JSON part re-encoded from
        what was read (raw mode has no JSON to carry them, and is left as it is)."""
        header = self.whole_header()
        if header is None or not values:
            return self
        header = {**header, "parameters": {**self.parameters, **values}}
        head = _encode(header)
        if self.header_length is None:
            return Inference(head, None, header)
        if isinstance(self.body, BodyPieces):  # the binary part's pieces stay as they are
            return Inference(BodyPieces([head, *self.body.after(self.header_length)]), len(head), header)
        return Inference(head + self.body[self.header_length :], len(head), header)


def _json_part(body: HeldBody, header_length: int | None) -> RequestBody:
    if isinstance(body, BodyPieces):
        return body.prefix(header_length) if header_length is not None else body.joined()
    return codec.json_part(body, header_length)


def _encode(header: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(header)
    except orjson.JSONEncodeError as exc:  # a lone surrogate escaped in a string, say
        raise Unreadable(f"the request holds a value that cannot be written back ({exc})") from None


def read(body: RequestBody, header_length: int | None, transcode_min_bytes: int = 0) -> Inference:
    """Read an inference request (module docstring), refusing with 400 what Triton could read otherwise
    or what would crash it. A JSON body of ``transcode_min_bytes`` or more (0: never) is re-encoded in
    Triton's binary form when it can be (:mod:`smtriton.serve.dataplane.reading.transcode`)."""
    if header_length == 0:
        return Inference(body, 0, None)
    end = len(body) if header_length is None else header_length
    transcode_it = header_length is None and 0 < transcode_min_bytes <= end
    if end <= SMALL_JSON and not transcode_it:
        part = codec.json_part(body, header_length)
        if header_length is not None:
            return Inference(body, header_length, _binary_header(part))
        header, json_bytes = read_json_text(part)
        check_header(header, json_bytes)
        return Inference(body, header_length, header)
    document = _parse_large(codec.json_part(body, header_length))
    try:
        header = _header_of(document)
        check_header(header, end)
        if transcode_it:
            binary = transcode.to_binary(document, header)
            if binary is not None:
                return Inference(*binary)
        inputs = header.get("inputs")
        specs = inputs if isinstance(inputs, list) else ()  # none: Triton refuses the request itself
        complete = not any(isinstance(spec, dict) and spec.get("data") is LEFT_IN_BODY for spec in specs)
        return Inference(body, header_length, header, complete)
    finally:
        del document


def _binary_header(part: RequestBody) -> dict[str, Any]:
    """A binary request's small JSON part read and checked, or its reading kept from an earlier request
    that sent the same bytes (module docstring)."""
    key = bytes(part)  # (no copy of a part that is bytes already)
    header = _known.get(key)
    if header is None:
        header, json_bytes = read_json_text(part)
        check_header(header, json_bytes)
        if len(key) <= KNOWN_HEADER_BYTES:
            if len(_known) >= KNOWN_HEADERS:
                _known.clear()
            _known[key] = header
    return header


def _not_an_object() -> BadRequest:
    return BadRequest(f"Unable to parse 'inputs': the request is not a JSON object; {codec.ACCEPTED_BODIES}")


def read_json_text(part: RequestBody) -> tuple[dict[str, Any], int]:
    """The first JSON value of ``part`` read strictly (Triton's parser stops there and ignores what
    follows), and the number of bytes it takes; an inference request's JSON, so an object."""
    if _brackets(part, len(part)) > MAX_JSON_DEPTH:
        check_json_depth(part)  # simdjson says how deep it nests, without recursing
    text = part.decode("utf-8", "surrogateescape")  # what follows the first value may be anything
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        value, end = _SMALL_READER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise Unreadable(f"{exc.msg} at {exc.pos}") from None
    except ValueError:  # an integer past Python's limit on digits (rapidjson's double cannot hold it either)
        raise Unreadable(f"a number is too big: an integer of over {sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise JsonTooDeep from None
    if not isinstance(value, dict):
        raise _not_an_object()
    read = text[:end]
    if read.isascii():
        return value, end
    try:
        return value, len(read.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a byte that is not UTF-8: Triton's reader would let it through
        raise Unreadable(f"the request's JSON is not UTF-8 text (byte {len(read[: exc.start].encode())})") from None


def _parse_large(part: RequestBody) -> Any:
    try:
        return simdjson.Parser().parse(part)
    except (RuntimeError, ValueError) as exc:
        if is_depth_error(exc):
            raise JsonTooDeep from None
        raise Unreadable(simdjson_reason(exc)) from None


def simdjson_reason(exc: BaseException) -> str:
    """simdjson's reason for refusing a document, without its error code and boilerplate."""
    return str(exc).split(":", 1)[-1].split(".", 1)[0].strip()


# What a large request's header holds in place of an input's data, which it did not read (the re-encoding
# or Triton reads it). Keys Triton does not read are left out of the header: what is written back from it
# (the parameters the front adds, a request through shared memory) never carries them, as Triton ignores them.
LEFT_IN_BODY: Any = ...
# The keys Triton reads of a request, of each input and of each output (and the sessions' requestType).
_REQUEST_KEYS = frozenset({"id", "parameters", "inputs", "outputs", "requestType"})
_INPUT_KEYS = frozenset({"name", "datatype", "shape", "parameters"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})
_LISTS = frozenset({"inputs", "outputs"})  # read a member at a time by _header_of
_DATA = frozenset({"data"})


class _EveryKey(frozenset[str]):
    def __contains__(self, key: object) -> bool:
        return True


_EVERY_KEY = _EveryKey()


def _header_of(document: Any) -> dict[str, Any]:
    """A large document's values but its inputs' data (and keys Triton does not read), every object's
    keys checked for repeats."""
    if not isinstance(document, simdjson.Object):
        raise _not_an_object()
    header = _plain(document, _REQUEST_KEYS - _LISTS, _LISTS)
    for key, reads, left in (("inputs", _INPUT_KEYS, _DATA), ("outputs", _OUTPUT_KEYS, frozenset())):
        if key in header:
            specs = document[key]
            if isinstance(specs, simdjson.Array):
                header[key] = [
                    _plain(spec, reads, left) if isinstance(spec, simdjson.Object) else _value(spec) for spec in specs
                ]
            else:
                header[key] = _value(specs)
    return header


def _plain(obj: Any, reads: frozenset[str], left: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A simdjson object's members: the values of the keys in ``reads``, :data:`LEFT_IN_BODY` for those
    in ``left``; the others left out; a repeated key is refused."""
    keys = list(obj.keys())  # in the document's order, repeats included
    plain = _unique_object([(key, LEFT_IN_BODY) for key in keys])
    for key in keys:
        if key in reads:
            if "\x00" in key:  # simdjson cannot look such a key up
                raise Unreadable("a key of the request holds a NUL character")
            plain[key] = _value(obj[key])  # a proxy: its own objects are checked in turn
        elif key not in left:
            del plain[key]
    return plain


def _value(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return _plain(value, _EVERY_KEY)
    if isinstance(value, simdjson.Array):
        return [_value(item) for item in value]
    return value


def check_header(header: dict[str, Any], json_bytes: int) -> None:
    """Refuse (400) a request whose inputs declare shapes that are no sizes, or more elements of JSON
    data together than its ``json_bytes`` bytes of JSON could hold (one byte each at the least); or
    whose parameters hold an integer past 64 bits. An input whose data is elsewhere (binary, after the
    JSON, or shared memory) and not in the JSON is sized by Triton against its shape before it
    allocates anything."""
    _check_parameters(header.get("parameters"), "the request")
    outputs = header.get("outputs")
    for output in outputs if isinstance(outputs, list) else ():
        if isinstance(output, dict):
            _check_parameters(output.get("parameters"), f"output '{_name(output)}'")
            _check_region(output.get("parameters"), f"output '{_name(output)}'")
    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        return  # no inputs Triton would allocate for: it refuses the request itself
    declared = 0
    for spec in inputs:
        if not isinstance(spec, dict):
            continue
        name = _name(spec)
        shape = spec.get("shape")
        if shape is not None and not (
            isinstance(shape, list) and all(type(d) is int and 0 <= d < _SHAPE_END for d in shape)
        ):
            raise BadRequest(f"input '{name}': shape must be a list of non-negative integers, got {_short(shape)}")
        parameters = spec.get("parameters")
        _check_parameters(parameters, f"input '{name}'")
        _check_region(parameters, f"input '{name}'")
        elsewhere = isinstance(parameters, dict) and any(key in parameters for key in codec.DATA_ELSEWHERE)
        if elsewhere and "data" in spec:
            raise BadRequest(f"input '{name}' has both data and {_where(parameters)}: send one of them")
        if elsewhere or shape is None:
            continue  # Triton sizes it, or has no shape to allocate by: it refuses the request itself
        elements = math.prod(shape)
        declared += elements
        if declared > json_bytes:
            raise BadRequest(
                f"input '{name}' declares shape {shape}: {elements} elements, more than the request's "
                f"{json_bytes} bytes of JSON can hold (at least one byte an element"
                f"{', with the inputs before it' if declared > elements else ''})"
            )


def _where(parameters: Any) -> str:
    return next(key for key in codec.DATA_ELSEWHERE if key in parameters)


def _check_parameters(parameters: Any, owner: str) -> None:
    if not isinstance(parameters, dict):
        return
    for key, value in parameters.items():
        if type(value) is int and not _INT_MIN <= value < _UINT_END:
            raise BadRequest(f"{owner}: parameter '{key}' is an integer past 64 bits")


def _check_region(parameters: Any, owner: str) -> None:
    """A region of the front's own shared memory holds other clients' tensors: no request may name one."""
    if input_arena.names_own_region(parameters):
        raise BadRequest(f"{owner}: shared memory region '{parameters['shared_memory_region']}' is not registered")


def _name(spec: dict[str, Any]) -> str:
    name = spec.get("name")
    return name if isinstance(name, str) else "?"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# ----- depth alone: for JSON the front does not otherwise read (the generate endpoints) ------------
def is_depth_error(exc: BaseException) -> bool:
    """Whether simdjson refused a document for its nesting depth."""
    return "DEPTH_ERROR" in str(exc)


def _brackets(body: RequestBody, end: int) -> int:
    return body.count(b"[", 0, end) + body.count(b"{", 0, end)


def check_json_depth(body: RequestBody, end: int | None = None) -> None:
    """Raise :class:`JsonTooDeep` if the JSON in ``body[:end]`` nests deeper than the limit (or
    :class:`BadRequest` if it has more brackets than the limit and does not parse: simdjson checks that
    brackets balance before it descends, so a malformed document tells nothing about its depth, and one
    with that many brackets might recurse Triton's parser too deep). A malformed body with fewer
    brackets goes on to Triton, which reports the flaw in its words."""
    stop = len(body) if end is None else end
    if _brackets(body, stop) <= MAX_JSON_DEPTH:
        return
    try:
        document = simdjson.Parser().parse(body if stop == len(body) else body[:stop])
    except (RuntimeError, ValueError) as exc:
        if is_depth_error(exc):
            raise JsonTooDeep from None
        raise BadRequest(f"failed to parse the request JSON buffer: {simdjson_reason(exc)}") from None
    del document
