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


class NotPlain(Exception):
    """The text is not the JSON the walk expects."""


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
