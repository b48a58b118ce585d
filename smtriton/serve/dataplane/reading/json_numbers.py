"""The data arrays of a large JSON request parsed a slice at a time, straight into Triton's binary form.

Step 3 of :mod:`~smtriton.serve.dataplane.reading.large_json`: each data array, found by its skeleton's
scan, is parsed a megabyte at a time into its place in the re-encoded request, the event loop served
between slices. Each slice is parsed with the brackets open around it, so that its brackets are checked
as the whole array's; the array must hold numbers only (400 otherwise, as Triton answers), as many as
its shape holds.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import simdjson

from smtriton.serve.dataplane.reading import transcode
from smtriton.serve.dataplane.reading.inference import (
    MAX_JSON_DEPTH,
    JsonTooDeep,
    Unreadable,
    is_depth_error,
    simdjson_reason,
)
from smtriton.serve.errors import BadRequest
from smtriton.serve.triton.client import RequestBody

SCAN_WINDOW = 16 << 20  # bytes searched for the end of a data array (or a quote in it) in one step
_SLICE = 1 << 20  # bytes of numbers parsed in one step
_JSON_SPACE = b" \t\n\r"
SPACE = re.compile(rb"[ \t\n\r]*")
_OPEN, _CLOSE = ord("["), ord("]")


async def fill(body: RequestBody, span: tuple[int, int], spec: dict[str, Any], count: int, out: memoryview) -> None:
    """Parse the data array at ``span`` a slice at a time into ``out`` (its binary form, exactly as long).

    A slice ends before a comma and is parsed with the brackets open where it begins put before it and
    those still open where it ends put after it, so that simdjson checks its nesting as the whole array's
    (a bracket too many closes the array before the slice ends); the depth goes on from slice to slice
    by the count of brackets, and what simdjson cannot see across a cut (``[,`` or ``,]``) is checked
    there."""
    name = str(spec.get("name"))
    datatype = str(spec.get("datatype"))
    start, end = span
    for at in range(start, end, SCAN_WINDOW):
        if body.find(b'"', at, min(at + SCAN_WINDOW, end)) >= 0:
            raise BadRequest(f"input '{name}': {datatype} data must be numbers")
        await asyncio.sleep(0)
    view = memoryview(body)
    size = len(out)
    written = 0
    depth = 0  # brackets open where the slice begins
    at = start
    while at < end:
        stop = end if end - at <= _SLICE else body.rfind(b",", at, at + _SLICE)
        if stop <= at:
            stop = end
        if depth and _first(body, at, stop) in (b"]", b""):
            raise _malformed(name, "no value after a comma")
        text = np.frombuffer(body, np.uint8, stop - at, at)
        closing = depth + int(np.count_nonzero(text == _OPEN)) - int(np.count_nonzero(text == _CLOSE))
        if stop < end and (closing < 1 or _last(body, at, stop) == b"["):
            raise _malformed(name, "a comma outside the array" if closing < 1 else "no value before a comma")
        if closing > MAX_JSON_DEPTH:
            raise JsonTooDeep
        piece = b"".join([b"[" * depth, view[at:stop], b"]" * max(closing, 0)])
        values = _numbers(piece, datatype, name)
        if written + values.nbytes > size:
            raise BadRequest(f"input '{name}': more values than its shape {spec.get('shape')} holds")
        out[written : written + values.nbytes] = values.view(np.uint8).data  # one copy, onto its place
        written += values.nbytes
        depth = closing
        at = stop + 1
        await asyncio.sleep(0)
    if depth:
        raise _malformed(name, "its brackets do not match")
    if written != size:
        numeric = transcode.numeric_type(datatype)
        values_written = written // (numeric.itemsize if numeric is not None else 1)
        raise BadRequest(f"input '{name}': {values_written} values for its shape {spec.get('shape')} ({count})")


def _first(body: RequestBody, at: int, stop: int) -> bytes:
    """The first byte of ``body[at:stop]`` that is no JSON space (empty: there is none)."""
    match = SPACE.match(body, at, stop)
    assert match is not None  # it matches the empty string
    return bytes(body[match.end() : match.end() + 1]) if match.end() < stop else b""


def _last(body: RequestBody, at: int, stop: int) -> bytes:
    """The last byte of ``body[at:stop]`` that is no JSON space (empty: there is none)."""
    near = body[max(at, stop - 64) : stop].rstrip(_JSON_SPACE)
    return bytes(near[-1:] if near or stop - at <= 64 else body[at:stop].rstrip(_JSON_SPACE)[-1:])


def _malformed(name: str, why: str) -> Unreadable:
    return Unreadable(f"input '{name}': its data is no array of numbers ({why})")


def _numbers(piece: RequestBody, datatype: str, name: str) -> np.ndarray[Any, Any]:
    try:
        document = simdjson.Parser().parse(piece)
    except (RuntimeError, ValueError) as exc:
        if is_depth_error(exc):
            raise JsonTooDeep from None
        raise _malformed(name, simdjson_reason(exc)) from None
    try:
        return transcode.values(document, datatype)
    except transcode.NotNumbers as exc:
        raise BadRequest(f"input '{name}': {exc}") from None
    finally:
        del document
