"""JSON text walked by index, without building its values: where a member, an element or a value
lies, so that a request's or an answer's own characters can be kept and cut (the merging of requests
joins clients' ``data`` text, and cuts Triton's answers by rows)."""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable

scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
# one JSON value at an index: (value, its end)
_SCANNER = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
SPACE = " \t\n\r"
_SPACE_RUN = re.compile("[ \t\n\r]*")
# A "data" member whose array holds no quote, backslash, bracket or brace: numbers, booleans and nulls.
_SCALAR_DATA = re.compile(r'"data"[ \t\n\r]*:[ \t\n\r]*\[([^\[\]{}"\\]*)\]')


class NotPlain(Exception):
    """The text is not the JSON the walk expects."""


def scalar_data(text: str) -> tuple[list[tuple[int, int]], tuple[str, ...]]:
    """Where the insides of ``"data"`` arrays of scalars lie in ``text``, and the text around them.

    Found by pattern, not by a walk, so a match may lie where no data member is (in a string, say): a
    caller checks the spans once against a walk of one text, and may then take them as the data of any
    text with the same text around them. Its arrays' insides hold no quote, backslash, bracket or brace,
    so that text reads the same, member for member, whatever scalars they hold."""
    spans = [found.span(1) for found in _SCALAR_DATA.finditer(text)] if '"data"' in text else []
    around, at = [], 0
    for start, stop in spans:
        around.append(text[at:start])
        at = stop
    around.append(text[at:])
    return spans, tuple(around)


def skip(text: str, at: int) -> int:
    """The first index from ``at`` on that is not white space (compact JSON: ``at`` itself)."""
    return at if at >= len(text) or text[at] not in SPACE else _SPACE_RUN.match(text, at).end()  # type: ignore[union-attr]


def value_end(text: str, at: int) -> int:
    """Where the JSON value at ``at`` ends."""
    try:
        return int(_SCANNER(text, at)[1])
    except StopIteration:  # the scanner's way of saying "no value here"
        raise NotPlain from None


def walk_object(text: str, at: int, member: Callable[[str, int], int]) -> int:
    """Walk the JSON object at ``at``: ``member(key, value start)`` returns each value's end; the
    object's end is returned."""
    at = skip(text, at)
    if text[at] != "{":
        raise NotPlain
    at = skip(text, at + 1)
    if text[at] == "}":
        return at + 1
    while True:
        if text[at] != '"':
            raise NotPlain
        key, at = scanstring(text, at + 1)
        at = skip(text, at)
        if text[at] != ":":
            raise NotPlain
        at = skip(text, member(key, skip(text, at + 1)))
        if text[at] == "}":
            return at + 1
        if text[at] != ",":
            raise NotPlain
        at = skip(text, at + 1)


def walk_array(text: str, at: int, element: Callable[[int], int]) -> int:
    """Walk the JSON array at ``at``: ``element(start)`` returns each element's end; the array's end is
    returned."""
    if text[at] != "[":
        raise NotPlain
    at = skip(text, at + 1)
    if text[at] == "]":
        return at + 1
    while True:
        at = skip(text, element(at))
        if text[at] == "]":
            return at + 1
        if text[at] != ",":
            raise NotPlain
        at = skip(text, at + 1)
