"""Every error `serve` raises, in one tree, and the one JSON shape an error answer has.

Request errors (:class:`ServeError` and its subclasses) each carry the HTTP status the client gets;
the Triton client raises them too (Triton unavailable, upstream timeout, model load failed), and the
HTTP edge turns any of them into ``{"error": "<message>"}`` in one place. Start-up errors
(:class:`StartupError`: settings, repository, Triton installation) make `serve` exit 1 with their
message before anything listens.
"""

from __future__ import annotations

import re

import orjson

# Triton's namespaced names leak the repository path ("/opt/ml/model::name"); keep only the name
# (docs/contract.md §6 B14).
_REPO_PREFIX = re.compile(r"(?<=')/[^'\s]*::")
# A lone surrogate: no UTF-8 text holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")

INTERNAL_ERROR = "internal error in the front server (logged); the request may be retried"


class StartupError(Exception):
    """`serve` cannot start as configured; the message says what to change."""


class ServeError(Exception):
    """A request failed; ``status`` is the HTTP status the client gets, ``message`` its error text."""

    status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ServeError):
    status = 400


class ClientGone(BadRequest):
    """The client closed the connection before its body was complete; nobody reads this answer."""

    def __init__(self) -> None:
        super().__init__("the client closed the connection before the request body was complete")


class ModelLoadFailed(BadRequest):
    """Triton refused to load a model (its message says why)."""


class ModelNotFound(ServeError):
    status = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"model '{name}' is not loaded")


class Conflict(ServeError):
    status = 409


class PayloadTooLarge(ServeError):
    status = 413

    def __init__(self, limit: int, why: str = "") -> None:
        super().__init__(f"request body is larger than the limit of {limit} bytes{why}")

    @classmethod
    def saying(cls, message: str) -> PayloadTooLarge:
        """A 413 for a reason other than the body limit."""
        error = cls(0)
        ServeError.__init__(error, message)
        return error


class UnsupportedEncoding(ServeError):
    status = 415


class UnsupportedMediaType(ServeError):
    """A body of a type the model cannot take (an image for a model without one BYTES input)."""

    status = 415


class RequestTimeout(ServeError):
    """The client took too long to send its request's headers, or paused its body too long."""

    status = 408


class UriTooLong(ServeError):
    status = 414

    def __init__(self, limit: int) -> None:
        super().__init__(f"request URL is longer than the limit of {limit} bytes")


class HeadersTooLarge(ServeError):
    status = 431

    def __init__(self, limit: int) -> None:
        super().__init__(f"request headers are larger than the limit of {limit} bytes")


class InternalError(ServeError):
    """Something inside `serve` or Triton's control plane failed; not the client's fault."""


class NotReady(ServeError):
    """The model (or Triton) is not ready yet, or the server is shutting down."""

    status = 503


class TritonUnavailable(NotReady):
    """Triton did not answer: it is restarting or has died. ``sent``: the request may have reached it
    (False: no connection was made, so nothing was sent)."""

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class KilledTriton(ServeError):
    """A request that was in flight at two Triton deaths in a row: it is not sent a third time."""

    status = 500


class UpstreamTimeout(ServeError):
    status = 504


class InsufficientStorage(ServeError):
    """Not enough memory to load (or run) a model: SageMaker unloads another model and retries."""

    status = 507


class UpstreamError(ServeError):
    """Triton answered a control-plane call with an error status of its own, passed on as is."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Relayed(ServeError):
    """An error decided in another process of `serve` (the main process, for a front worker), carried
    over with its status and message so the client gets exactly what was decided."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_body(message: str) -> bytes:
    """Compact ``{"error": ...}`` exactly as Triton writes it (what is not UTF-8 in it escaped)."""
    try:
        return orjson.dumps({"error": strip_repository_paths(message)})
    except orjson.JSONEncodeError:
        return orjson.dumps({"error": strip_repository_paths(readable(message))})


def strip_repository_paths(message: str) -> str:
    return _REPO_PREFIX.sub("", message)


def readable(text: str) -> str:
    """``text`` as an answer (JSON, UTF-8) can carry it: a lone surrogate, which stands for a byte of a
    name that is not UTF-8 (as ``os`` gives a file's name), written as that byte's ``\\xNN`` (one that
    stands for no byte as ``\\uNNNN``)."""
    return _SURROGATE.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"
