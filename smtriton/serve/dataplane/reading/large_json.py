"""Large JSON inference requests, read and re-encoded in slices: no step holds the event loop long.

Read whole, a JSON request of hundreds of megabytes holds its worker's event loop (and the GIL) for
seconds: simdjson's parse alone takes about a second a gigabyte and lets no other thread run, and
meanwhile `/ping` waits and the main process's heartbeat goes unanswered, until the worker is taken
for a frozen one and killed with every request it holds. So a JSON body past :data:`SLICED_JSON_BYTES`
is read here in steps that each take a few milliseconds, the event loop served between them:

1. its *skeleton* — the request but its inputs' ``data`` arrays — is found by a scan that jumps over
   each data array (the brackets of other values counted by numpy, a megabyte at a time), and read by
   the request's one reading (:mod:`smtriton.serve.dataplane.reading.inference`), with all its checks:
   the values of keys Triton does not read are JSON as Triton's parser would have them, and are then
   not carried over; nothing but space may follow the request;
2. the memory the re-encoded request needs is compared with what the container has free (a request
   that cannot fit is refused with 413 before anything is allocated for it);
3. each data array is parsed a megabyte at a time straight into its place in Triton's binary form (each
   slice with the brackets open around it, so that its brackets are checked as the whole array's:
   :mod:`~smtriton.serve.dataplane.reading.json_numbers`), and the request goes to Triton binary.

Such a request must carry numbers: a data array of strings, booleans or FP16 values this large is
refused with 413 saying to send it as binary+json. A data array must be JSON as Triton would read it
(400 otherwise, as Triton answers), but its nesting is not checked against the shape, only its number
of values (Triton never reads the JSON: it gets the binary tensors).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson

from smtriton.serve.dataplane.reading import json_numbers, transcode
from smtriton.serve.dataplane.reading.inference import (
    LEFT_IN_BODY,
    Inference,
    Unreadable,
    check_header,
    read_json_text,
)
from smtriton.serve.dataplane.reading.json_numbers import SCAN_WINDOW, SPACE
from smtriton.serve.errors import BadRequest, PayloadTooLarge
from smtriton.serve.host import cgroups, memory
from smtriton.serve.triton.client import RequestBody
from smtriton.serve.triton.request_body import BodyPieces

# JSON bodies past this size are read in slices.
SLICED_JSON_BYTES = 8 << 20
_WINDOW = 1 << 20  # bytes scanned for brackets in one step
_SKELETON_MAX = 1 << 20  # the JSON outside the inputs' data may be this long at most
_NUMBERS_ONLY = (
    f"a JSON request over {SLICED_JSON_BYTES >> 20} MiB must carry each input's data in its JSON as numbers "
    "(FP32, FP64, INT*, UINT*); send others this large as binary+json"
)
_REQUEST_KEYS = frozenset({"id", "parameters", "inputs", "outputs", "requestType"})
_INPUT_KEYS = frozenset({"name", "datatype", "shape", "parameters", "data"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR = re.compile(rb"[^ \t\n\r,\]}]+")
# +1 for an opening bracket, -1 for a closing one, 0 for any other byte
_DEPTH = np.zeros(256, dtype=np.int8)
_DEPTH[[ord("["), ord("{")]] = 1
_DEPTH[[ord("]"), ord("}")]] = -1


def _unreadable(pos: int) -> Unreadable:
    return Unreadable(f"the request's JSON is malformed at byte {pos}")


# ----- the scan ------------------------------------------------------------------------------------------
class _Scan:
    """A cursor over the body's JSON that yields to the event loop between large steps."""

    def __init__(self, body: RequestBody) -> None:
        self.body = body
        self.pos = 0

    def space(self) -> None:
        match = SPACE.match(self.body, self.pos)
        assert match is not None  # it matches the empty string
        self.pos = match.end()

    def expect(self, char: bytes) -> None:
        self.space()
        if self.body[self.pos : self.pos + 1] != char:
            raise _unreadable(self.pos)
        self.pos += 1

    def peek(self) -> bytes:
        self.space()
        return bytes(self.body[self.pos : self.pos + 1])

    def string(self) -> bytes:
        """The string at the cursor, its raw text (escapes kept)."""
        self.space()
        match = _STRING.match(self.body, self.pos)
        if match is None:
            raise _unreadable(self.pos)
        self.pos = match.end()
        return bytes(match.group())

    async def value(self) -> tuple[int, int]:
        """The span of the value at the cursor (the cursor moves past it)."""
        self.space()
        start = self.pos
        first = self.body[start : start + 1]
        if first == b'"':
            self.string()
        elif first in (b"[", b"{"):
            self.pos = await _container_end(self.body, start)
        else:
            match = _SCALAR.match(self.body, start)
            if match is None:
                raise _unreadable(start)
            self.pos = match.end()
        return start, self.pos

    async def members(self) -> AsyncIterator[tuple[bytes, str]]:
        """Each member of the object at the cursor: (raw key, its name), the cursor on its value."""
        self.expect(b"{")
        if self.peek() == b"}":
            self.pos += 1
            return
        while True:
            key = self.string()
            self.expect(b":")
            yield key, _key_name(key)
            if self._closed_by(b"}"):
                return

    async def elements(self) -> AsyncIterator[None]:
        """Each element of the array at the cursor, the cursor on it."""
        self.expect(b"[")
        if self.peek() == b"]":
            self.pos += 1
            return
        while True:
            yield
            if self._closed_by(b"]"):
                return

    def _closed_by(self, closing: bytes) -> bool:
        """After a member or an element: True at the container's end, False at the comma before the next."""
        separator = self.peek()
        self.pos += 1
        if separator == closing:
            return True
        if separator != b",":
            raise _unreadable(self.pos - 1)
        return False


def _key_name(raw: bytes) -> str:
    try:
        name = json.loads(raw)
    except ValueError:
        raise Unreadable(f"the request holds a key that is no JSON string: {raw[:40]!r}") from None
    return name if isinstance(name, str) else ""


async def _data_end(body: RequestBody, start: int) -> int:
    """Where the data array opening at ``start`` ends, found without reading it: numbers hold no quote
    and no brace, so the array ends at the last ``]`` before the first quote (the input's next key) or
    brace (the input's end) after it. A quote inside it is a string: no data this reading takes."""
    size = len(body)
    at = start
    while at < size:
        stop = min(at + SCAN_WINDOW, size)
        quote, brace = body.find(b'"', at, stop), body.find(b"}", at, stop)
        found = [i for i in (quote, brace) if i >= 0]
        if found:
            boundary = min(found)
            end = body.rfind(b"]", start, boundary)
            if end < 0:
                raise PayloadTooLarge.saying(_NUMBERS_ONLY)
            return end + 1
        at = stop
        await asyncio.sleep(0)
    raise _unreadable(size)


async def _container_end(body: RequestBody, start: int) -> int:
    """Where the array or object opening at ``start`` ends: its brackets counted by numpy a window at a
    time, the strings in it stepped over (their brackets are text)."""
    depth = 0
    at = start
    size = len(body)
    while at < size:
        quote = body.find(b'"', at, min(at + _WINDOW, size))
        stop = quote if quote >= 0 else min(at + _WINDOW, size)
        if stop > at:
            steps = _DEPTH[np.frombuffer(body, np.uint8, stop - at, at)]
            running = np.cumsum(steps, dtype=np.int64) + depth
            closed = np.flatnonzero(running <= 0)
            if closed.size:
                return at + int(closed[0]) + 1
            depth = int(running[-1])
        if quote >= 0:
            match = _STRING.match(body, quote)
            if match is None:
                raise _unreadable(quote)
            at = match.end()
        else:
            at = stop
        await asyncio.sleep(0)
    raise _unreadable(size)


# ----- the skeleton --------------------------------------------------------------------------------------
class _Skeleton:
    """The request's JSON as it is written, but what is left out: bounded in length."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.length = 0

    def add(self, *pieces: bytes) -> None:
        for piece in pieces:
            self.pieces.append(piece)
            self.length += len(piece)
        if self.length > _SKELETON_MAX:
            raise PayloadTooLarge.saying(
                f"the JSON of this request outside its inputs' data is over {_SKELETON_MAX >> 20} MiB"
            )

    def text(self) -> bytes:
        return b"".join(self.pieces)


async def _skeleton(body: RequestBody) -> tuple[bytes, dict[int, tuple[int, int]]]:
    """The request's JSON without its inputs' data (each ``null``), and where each input's data array
    lies."""
    scan = _Scan(body)
    out = _Skeleton()
    spans: dict[int, tuple[int, int]] = {}
    index = 0
    out.add(b"{")
    separator = b""
    async for raw, name in scan.members():
        out.add(separator, raw, b":")
        separator = b","
        if name == "inputs" and scan.peek() == b"[":
            out.add(b"[")
            between = b""
            async for _ in scan.elements():
                out.add(between)
                between = b","
                if scan.peek() == b"{":
                    await _input(scan, out, spans, index)
                else:
                    start, end = await scan.value()
                    out.add(bytes(body[start:end]))
                index += 1
            out.add(b"]")
        else:
            start, end = await scan.value()
            out.add(bytes(body[start:end]))
    out.add(b"}")
    scan.space()
    if scan.pos != len(body):  # as the whole reading refuses it
        raise _unreadable(scan.pos)
    return out.text(), spans


async def _input(scan: _Scan, out: _Skeleton, spans: dict[int, tuple[int, int]], index: int) -> None:
    """One input's object: its members but the data array, whose span is kept."""
    body = scan.body
    out.add(b"{")
    between = b""
    async for raw, name in scan.members():
        out.add(between, raw, b":")
        between = b","
        if name == "data" and scan.peek() == b"[":
            start = scan.pos
            scan.pos = end = await _data_end(body, start)
            spans[index] = (start, end)
            out.add(b"null")
            continue
        start, end = await scan.value()
        out.add(bytes(body[start:end]))
    out.add(b"}")
    await asyncio.sleep(0)


# ----- the request ---------------------------------------------------------------------------------------
async def read(body: RequestBody) -> Inference:
    """A JSON-only request past :data:`SLICED_JSON_BYTES`, read in slices and made Triton's binary form
    (the module's docstring); 400 for what Triton could read otherwise, 413 for what is too large."""
    text, spans = await _skeleton(body)
    header, _ = read_json_text(text)
    inputs = header.get("inputs")
    for index in spans:
        if isinstance(inputs, list) and index < len(inputs) and isinstance(inputs[index], dict):
            inputs[index]["data"] = LEFT_IN_BODY
    check_header(header, len(body))
    plan = _plan(header, spans)
    request = {key: value for key, value in header.items() if key in _REQUEST_KEYS and key != "inputs"}
    request["inputs"] = [encoded for encoded, _, _, _ in plan]
    if isinstance(request.get("outputs"), list):
        request["outputs"] = [_known(spec, _OUTPUT_KEYS) for spec in request["outputs"]]
    head = orjson.dumps(request)
    total = len(head) + sum(size for _, _, _, size in plan)
    _check_room(len(body), total)
    values_bytes = total - len(head)
    # The tensors are written a slice at a time into memory given as it is written (never zero-filled
    # first: filling a gigabyte with zeros holds the event loop for most of a second; never grown: a
    # growing buffer is copied whole when its allocator cannot extend it in place, a third of a second
    # a gigabyte on the event loop). They go to Triton after the JSON part without being joined to it.
    # Empty tensors' data is read all the same: it must be an array, and hold no values.
    values = memory.untouched(values_bytes) if values_bytes else memoryview(bytearray())
    try:
        at = 0
        for encoded, span, count, size in plan:
            await json_numbers.fill(body, span, encoded, count, values[at : at + size])
            at += size
    except BaseException:
        if values_bytes:
            memory.give_back_beside_loop(values)
        raise
    if not values_bytes:
        return Inference(head, len(head), request)
    return Inference(BodyPieces([head, values], total), len(head), request)


def _known(spec: Any, keys: frozenset[str]) -> Any:
    """An object's members Triton reads (what is no object is left for Triton to refuse)."""
    return {key: value for key, value in spec.items() if key in keys} if isinstance(spec, dict) else spec


def _plan(
    header: dict[str, Any], spans: dict[int, tuple[int, int]]
) -> list[tuple[dict[str, Any], tuple[int, int], int, int]]:
    """For each input: its header in the binary form, its data span, its count of values, its bytes."""
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("Unable to parse 'inputs': a request needs a non-empty 'inputs' array")
    plan = []
    for index, spec in enumerate(inputs):
        if not isinstance(spec, dict):
            raise BadRequest("each input must be an object")
        name = spec.get("name") if isinstance(spec.get("name"), str) else "?"
        numeric = transcode.numeric_type(spec.get("datatype"))
        parameters = spec.get("parameters") or {}
        shape = spec.get("shape")
        if index not in spans or numeric is None or not isinstance(parameters, dict) or not isinstance(shape, list):
            raise PayloadTooLarge.saying(f"input '{name}': {_NUMBERS_ONLY}")
        count = math.prod(shape)
        size = count * numeric.itemsize
        encoded = _known(spec, _INPUT_KEYS - {"data"})
        encoded["parameters"] = {**parameters, "binary_data_size": size}
        plan.append((encoded, spans[index], count, size))
    return plan


def _check_room(body_bytes: int, encoded_bytes: int) -> None:
    """413 when the re-encoded request (which Triton then holds once more) cannot fit in the memory the
    container has free, rather than the OOM killer choosing."""
    free = cgroups.available_memory(cgroups.memory_group())
    needed = 2 * encoded_bytes
    if free is not None and needed > free:
        raise PayloadTooLarge.saying(
            f"this request ({body_bytes >> 20} MiB of JSON) needs about {needed >> 20} MiB of memory to "
            f"re-encode and run, and the container has {free >> 20} MiB free"
        )
