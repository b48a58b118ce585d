"""Requests that would crash Triton, refused before they reach it.

Triton's JSON parser is recursive: a body nested a few hundred thousand levels deep (200,000 ``[``,
or a small gzip body that inflates to megabytes of ``[``) overflows its stack, and the whole server
dies with every request in flight. Nothing a model accepts is nested anywhere near
:data:`MAX_JSON_DEPTH` levels (a tensor of rank 8 inside a KServe request is about 12 deep), so a
deeper body is refused with 400. Counting ``[`` and ``{`` (at C speed) rules out nearly every body;
only a body with more brackets than the limit is parsed (simdjson, which stops at the limit), and
refused if it does not parse.
"""

from __future__ import annotations

import simdjson

from smtriton.serve.errors import BadRequest

# simdjson's own maximum depth: the parse that checks a body stops there.
MAX_JSON_DEPTH = 1024


class JsonTooDeep(BadRequest):
    def __init__(self) -> None:
        super().__init__(f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")


def is_depth_error(exc: BaseException) -> bool:
    """Whether simdjson refused a document for its nesting depth."""
    return "DEPTH_ERROR" in str(exc)


def _brackets(body: bytes, end: int) -> int:
    return body.count(b"[", 0, end) + body.count(b"{", 0, end)


def refuse_unparsed(body: bytes, exc: BaseException, end: int | None = None) -> None:
    """After simdjson failed to parse ``body[:end]``: raise when forwarding it could crash Triton.

    simdjson checks that brackets balance before it descends, so a malformed document tells nothing
    about its depth; one with more brackets than the limit might recurse Triton's parser too deep,
    and is refused here in Triton's words for a body it cannot parse. Any other malformed body goes on
    to Triton, which reports the flaw itself.
    """
    if is_depth_error(exc):
        raise JsonTooDeep from None
    if _brackets(body, len(body) if end is None else end) > MAX_JSON_DEPTH:
        reason = str(exc).split(":", 1)[-1].split(".", 1)[0].strip()
        raise BadRequest(f"failed to parse the request JSON buffer: {reason}") from None


def check_json_depth(body: bytes, end: int | None = None) -> None:
    """Raise :class:`JsonTooDeep` if the JSON in ``body[:end]`` nests deeper than the limit (or
    :class:`BadRequest` if it has more brackets than the limit and does not parse)."""
    stop = len(body) if end is None else end
    if _brackets(body, stop) <= MAX_JSON_DEPTH:
        return
    try:
        document = simdjson.Parser().parse(body if stop == len(body) else body[:stop])
    except (RuntimeError, ValueError) as exc:
        refuse_unparsed(body, exc, stop)
        return
    del document
