"""`GET /models` a page at a time, oldest load first (docs/contract.md §2.4)."""

from __future__ import annotations

import logging

from smtriton.serve.errors import BadRequest
from smtriton.serve.multimodel.records import ModelRecord

log = logging.getLogger("serve.mme")


def page(records: list[ModelRecord], token: str | None, limit_raw: str | None) -> dict[str, object]:
    """One page of the model list, oldest load first; the token is an opaque offset."""
    try:
        limit = int(limit_raw) if limit_raw is not None else 100
    except ValueError:
        raise BadRequest(f"invalid limit '{limit_raw}'") from None
    if not 1 <= limit <= 1000:
        raise BadRequest("limit must be between 1 and 1000")
    start = 0 if token is None else _page_start(token, len(records))
    chunk = records[start : start + limit]
    body: dict[str, object] = {"models": [r.describe() for r in chunk]}
    if start + limit < len(records):
        body["nextPageToken"] = str(start + limit).encode().hex()
    return body


def _page_start(token: str, count: int) -> int:
    """Where a page token we issued continues; a token we did not issue (NVIDIA's front end takes any)
    must not fail the platform's listing: it starts from the beginning, and is logged."""
    try:
        start = int(bytes.fromhex(token).decode())
    except (ValueError, UnicodeDecodeError):
        start = -1
    if 0 <= start <= count:
        return start
    log.info("next_page_token %r was not issued here; listing from the beginning", token[:64])
    return 0
