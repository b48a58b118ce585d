"""Error types and the one JSON shape every error answer has: ``{"error": "<message>"}``."""

from __future__ import annotations

import re

import orjson

# B14: Triton's namespaced names leak the repository path ("/opt/ml/model::name"); keep only the name.
_REPO_PREFIX = re.compile(r"(?<=')/[^'\s]*::")


class ServeError(Exception):
    """An error with the HTTP status the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BadRequest(ServeError):
    def __init__(self, message: str) -> None:
        super().__init__(400, message)


class PayloadTooLarge(ServeError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {limit} bytes")


class HeadersTooLarge(ServeError):
    def __init__(self, limit: int) -> None:
        super().__init__(431, f"request headers are larger than the limit of {limit} bytes")


class NotReady(ServeError):
    def __init__(self, message: str) -> None:
        super().__init__(503, message)


class UpstreamUnavailable(ServeError):
    def __init__(self, message: str) -> None:
        super().__init__(503, message)


INTERNAL_ERROR = "internal error in the front server (logged); the request may be retried"


def error_body(message: str) -> bytes:
    """Compact ``{"error": ...}`` exactly as Triton writes it."""
    return orjson.dumps({"error": strip_repository_paths(message)})


def strip_repository_paths(message: str) -> str:
    return _REPO_PREFIX.sub("", message)
