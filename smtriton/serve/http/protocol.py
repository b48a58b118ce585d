"""The HTTP protocol with the front's rules: uvicorn's httptools protocol, with every request's route
matched once and these rules applied while the request is parsed, before a route sees it:

- a URL longer than the header limit is answered 414, headers past it 431, as soon as they pass it
  (nothing unbounded is buffered first); a head's bytes are counted from where it begins, so that many
  requests pipelined in one read never add up to a false 431 (:func:`head_start`);
- a request's headers must arrive within ``SMTRITON_CLIENT_TIMEOUT_S`` of its first byte, its body
  may not pause longer than that, and the whole body must arrive within ``SMTRITON_BODY_TIMEOUT_S`` of
  the headers, however steadily it trickles: 408; a connection that sends nothing for that long is
  closed;
- a request that is not valid HTTP/1.1 is answered 400 only after every complete request before it on
  the connection has its answer (HTTP/1.1 answers in order), then the connection closes;
- an answer given before its request's body has ended (a refusal: 413 for the size, 400, 405, ...) reaches
  a client that is still sending that body. Closing with the client's bytes unread makes the kernel
  reset the connection, and a client still writing sees "connection reset" instead of the answer. So
  the rest of a body whose declared length is at most :data:`DRAIN_BYTES` is read and dropped and the
  connection kept; any other such answer says ``Connection: close`` and the connection *lingers*, as
  nginx's and Apache's do: this side is closed, and what the client still sends is read and dropped
  until it closes too, or :data:`DRAIN_BYTES` or ``SMTRITON_CLIENT_TIMEOUT_S`` pass (then it is
  closed). The refusals above close the same way.

Each refusal is a JSON error body, like every other error. The timers behind these rules, and uvicorn's
keep-alive timer, are armed only when a wait begins and are never re-made for each request or body
piece: a request that arrives in one read arms none, and a timer that fires early (its deadline moved)
arms itself again for what is left. Each timer made and cancelled costs some 4 µs of the worker's CPU;
a small request used to make five. uvicorn still owns the rest of the connection: parsing
(httptools), keep-alive, pipelining, the SIGTERM drain. The route
matched here travels to the ASGI app in the scope; the fast path (`smtriton.serve.http.fastpath`)
subclasses this protocol to serve the data routes without ASGI.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from smtriton.serve.errors import (
    BadRequest,
    HeadersTooLarge,
    RequestTimeout,
    ServeError,
    UriTooLong,
    error_body,
)
from smtriton.serve.http.routes import ROUTE_SCOPE_KEY, Route, route_of
from smtriton.serve.settings import Settings

log = logging.getLogger("serve")
_JSON = b"application/json"
_BLANK_LINE = b"\r\n\r\n"  # the end of a head, and of a chunked body
# The most a connection reads and drops of a body answered before its end: a declared body up to this
# size keeps its connection, and a lingering connection is closed past this much more.
DRAIN_BYTES = 64 << 20


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused (the reason is kept)."""


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the front's rules (module docstring)."""

    settings: Settings  # set by the subclass uvicorn instantiates (:func:`smtriton.serve.http.fastpath.data_protocol`)
    drain_bytes = DRAIN_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = self.settings
        self._limit = settings.max_header_bytes
        self._timeout = settings.client_timeout_s
        self._in_head = False  # between a request's first byte and its last header
        self._header_bytes = 0  # names and values of this request's headers
        self._head_received = 0  # bytes received since the head began (a line httptools still buffers too)
        self._read_piece: bytes | None = None  # in this read, the last body piece of the request being parsed
        self._ended_with: bytes | None = None  # in this read, the body piece the last request parsed ended with
        self._owed = 0  # requests parsed whole and not yet answered
        self._why: ServeError | None = None  # what a parser callback refused
        self._refusal: ServeError | None = None  # decided; written once the answers owed are out
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline_s = settings.body_timeout_s
        self._whole_body_timer: asyncio.TimerHandle | None = None  # the whole body's deadline
        self._in_body = False  # between a request's last header and the end of its body
        self._watch_head = False  # a head began in this read: its timer is armed if the read ends in it
        self._watch_body = False  # a body began in this read: likewise
        self._last_piece = 0.0  # when the body's last piece came, while its pause timer is armed
        self._idle_since: float | None = None  # when the last answer went out; None while a request is on
        self._answers: AnswerTransport  # the transport the answers write to (set once connected)
        self._held: RequestResponseCycle | None = None  # keep-alive held off while its body is unended
        self._drain_timer: asyncio.TimerHandle | None = None  # the end of a drain or a linger
        self._drain_left = 0  # bytes a lingering connection still reads and drops
        self._lingering = False  # this side closed: reading and dropping until the client closes too

    # ----- the connection ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._answers = AnswerTransport(transport, self._close_after_answer)
        self._head_timer = self.loop.call_later(self._timeout, self._silent_too_long)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        self._answers.detach()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._drain_left -= len(data)
            if self._drain_left < 0:
                self.transport.abort()  # past the bound: closed, unread
            return
        if self._refusal is not None:
            return  # refused: nothing more is parsed on this connection
        super().data_received(data)
        ended_with = self._ended_with
        self._read_piece = self._ended_with = None  # nothing of a read is kept past it
        if self._refusal is not None:
            return
        if self._in_head:
            if self._watch_head:  # the head began in this read: only its own bytes count
                self._head_received = len(data) - head_start(data, ended_with)
            else:
                self._head_received += len(data)
            if self._head_received > 3 * self._limit:  # the URL and the headers at their limits, and more
                self._refuse(HeadersTooLarge(self._limit))
                return
        # The read is parsed: a head or body it began and did not finish is waited for from now on.
        if self._watch_head:
            self._watch_head = False
            if self._in_head:
                self._head_timer = self.loop.call_later(self._timeout, self._head_too_slow)
        if self._watch_body:
            self._watch_body = False
            if self._in_body:
                self._last_piece = self.loop.time()
                self._body_timer = self.loop.call_later(self._timeout, self._body_too_slow)
                self._whole_body_timer = self.loop.call_later(self._body_deadline_s, self._body_too_long)
                self._hold_keep_alive()

    def eof_received(self) -> None:
        if self._lingering:
            self.transport.close()  # the client closed too: nothing more comes
            return
        super().eof_received()

    def shutdown(self) -> None:
        """uvicorn's stop: a lingering connection is closed now, and an answer still to come closes its
        connection as uvicorn sets it."""
        self._held = None
        if self._lingering:
            self.transport.close()
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what httptools could not parse (or a callback refused)."""
        why, self._why = self._why, None
        self._refuse(why or BadRequest("the request is not valid HTTP/1.1"))

    # ----- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._header_bytes = self._head_received = 0
        self._cancel_timers()
        self._watch_head = True

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self._limit:
            self._why = UriTooLong(self._limit)
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self._limit:
            self._why = HeadersTooLarge(self._limit)
            raise _Refused

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_timers()
        self._in_body = self._watch_body = True
        before = self.cycle
        path = path_of(self.url)
        self._dispatch(route_of(self.parser.get_method(), path) if path is not None else None)
        if self.cycle is not before:
            self._owed += 1

    def _dispatch(self, route: Route | None) -> None:
        """Hand the parsed request on with the route it matched (None: a path uvicorn refuses): here, to
        the ASGI app, the route left in its scope."""
        if route is not None:
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[ROUTE_SCOPE_KEY] = route
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = self._answers  # its answer closes through the protocol

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_arrived(body)

    def on_chunk_header(self) -> None:
        """A chunk's size line: a chunked body ends with its last chunk's framing, not with a piece."""
        self._read_piece = None

    def on_message_complete(self) -> None:
        self._body_done()
        super().on_message_complete()

    def _body_arrived(self, piece: bytes) -> None:
        """A piece of the body came: the pause allowed starts again (the armed timer looks at this)."""
        self._read_piece = piece
        if self._body_timer is not None:
            self._last_piece = self.loop.time()

    def _body_done(self) -> None:
        self._in_body = False
        self._ended_with, self._read_piece = self._read_piece, None
        for timer in (self._body_timer, self._whole_body_timer):
            if timer is not None:
                timer.cancel()
        self._body_timer = self._whole_body_timer = None
        held = self._held
        if held is not None:
            self._held = None
            if not held.response_started:
                held.keep_alive = True  # the body ended before its answer: nothing is left unread
        if self._drain_timer is not None:  # the body of a request answered already is read: idle from now
            self._drain_timer.cancel()
            self._drain_timer = None
            self._idle_from_now()

    def _hold_keep_alive(self) -> None:
        """The body goes on past this read: an answer given before its end may keep the connection only
        when the rest can be read and dropped (:func:`drainable`); until the body ends, keep-alive is held
        off, so that such an answer says ``Connection: close``."""
        cycle = self.cycle
        if cycle is not None and cycle.keep_alive and not drainable(cycle, self.drain_bytes):
            cycle.keep_alive = False
            self._held = cycle

    def on_response_complete(self) -> None:
        self._owed -= 1
        queued = len(self.pipeline)
        self._keep_alive_or_next()
        if self._refusal is not None and not self._lingering:
            self.flow.pause_reading()
            if len(self.pipeline) == queued and self._owed <= 0:  # nothing was started: all answered
                self._write_refusal()

    # ----- keep-alive ---------------------------------------------------------------------------------
    def _keep_alive_or_next(self) -> None:
        """uvicorn's ``on_response_complete``, its keep-alive timer kept across requests: the next
        pipelined request starts, the rest of a body answered before its end is read and dropped (within
        the client timeout), or the connection is idle from now and the armed timer looks at that."""
        self.server_state.total_requests += 1
        if self.transport.is_closing() or self._lingering:
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        if self._in_body:  # the answer's own body is still arriving
            self._drain_timer = self.loop.call_later(self._timeout, self._drained_too_long)
            return
        self._idle_from_now()

    def _idle_from_now(self) -> None:
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._idle_too_long)

    def _unset_keepalive_if_required(self) -> None:
        """uvicorn calls this as each read arrives: the connection is busy (its timer stays armed)."""
        self._idle_since = None

    def _idle_too_long(self) -> None:
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None:
            return  # a request is on: armed again when its answer is out
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0.001:  # the connection was used since this timer was armed
            self.timeout_keep_alive_task = self.loop.call_later(left, self._idle_too_long)
        else:
            self.timeout_keep_alive_handler()

    def awaiting_request(self) -> bool:
        """Whether a request is on its way on this connection: accepted and nothing parsed yet, or a
        request's head arriving. Closing such a connection would drop a request the client sent."""
        return (self.cycle is None or self._in_head) and not self.transport.is_closing() and not self._lingering

    # ----- refusals ----------------------------------------------------------------------------
    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer, self._whole_body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._whole_body_timer = None

    def _silent_too_long(self) -> None:
        if not self._in_head and self.cycle is None and not self.transport.is_closing():
            self.transport.close()  # connected, never sent a byte

    def _head_too_slow(self) -> None:
        if self._in_head:
            self._refuse(RequestTimeout(f"request headers not received within {self._timeout:g} s"))

    def _body_too_slow(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            return
        left = self._last_piece + self._timeout - self.loop.time()
        if left > 0.001:  # a piece came since this timer was armed: the pause counts from it
            self._body_timer = self.loop.call_later(left, self._body_too_slow)
            return
        if self.flow.read_paused:  # waiting for earlier answers or for the app to read: not the client's pause
            self._last_piece = self.loop.time()
            self._body_timer = self.loop.call_later(self._timeout, self._body_too_slow)
            return
        self._refuse(RequestTimeout(f"request body paused for more than {self._timeout:g} s"))

    def _body_too_long(self) -> None:
        """The whole body's deadline: a body that keeps trickling never trips the pause's timer."""
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            return
        if self.flow.read_paused:  # held back by the server, not the client: look again a pause later
            self._whole_body_timer = self.loop.call_later(self._timeout, self._body_too_long)
            return
        self._refuse(RequestTimeout(f"request body not received within {self._body_deadline_s:g} s"))

    def _refuse(self, error: ServeError) -> None:
        """Answer ``error`` and close, once every complete request before the refused one has its answer.
        A refusal inside a body concerns the request that body belongs to: it is not answered."""
        if self._refusal is not None:
            return
        self._refusal = error
        self._cancel_timers()
        self.flow.pause_reading()
        cycle = self.cycle
        if not self._in_head and cycle is not None and cycle.more_body and not cycle.response_complete:
            self._owed -= 1  # the refused request itself: its cycle never answers
            queued = [entry for entry in self.pipeline if entry[0] is cycle]
            for entry in queued:
                self.pipeline.remove(entry)
            if not queued:  # it is the one running now: nothing before it is left to answer
                self._owed = 0
        log.info("refused a request: %d %s", error.status, error.message)
        if self._owed <= 0:
            self._write_refusal()

    def _write_refusal(self) -> None:
        error = self._refusal
        if error is None or self.transport.is_closing() or self._lingering:
            return
        body = error_body(error.message)
        head = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:
            head += name, b": ", value, b"\r\n"
        head += b"content-type: ", _JSON, b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(b"".join(head) + body)
        self._linger()

    # ----- closing ---------------------------------------------------------------------------------
    def _close_after_answer(self) -> None:
        """An answer closes its connection: at once when the client has sent all it meant to, else
        after a linger (the module's docstring)."""
        if self.transport.is_closing() or self._lingering:
            return
        if self._in_head or self._in_body or self.pipeline:
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        """Close this side only, then read and drop what the client still sends until it closes too,
        :attr:`drain_bytes` or the client timeout pass: the answer written is not lost to a reset."""
        self._lingering = True
        self._answers.open = False
        self._held = None
        self._cancel_timers()
        for timer in (self.timeout_keep_alive_task, self._drain_timer):
            if timer is not None:
                timer.cancel()
        self.timeout_keep_alive_task = self._drain_timer = None
        transport = self.transport
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # once what is written has gone
        self._drain_left = self.drain_bytes
        self._drain_timer = self.loop.call_later(self._timeout, self._drained_too_long)
        self.flow.resume_reading()

    def _drained_too_long(self) -> None:
        """The client timeout passed while a body answered before its end still came, or a lingering
        connection's client did not close: closed, unread."""
        self._drain_timer = None
        self.transport.abort()


class AnswerTransport(asyncio.Transport):
    """A connection's transport as the answers to its requests see it: they write straight through it,
    and their closing goes to the protocol, which lingers while the client may still be sending."""

    __slots__ = ("_close", "_transport", "open")

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        super().__init__()
        self._transport = transport
        self._close: Callable[[], None] | None = close
        self.open = True  # False once lingering: nothing more is written

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.open:
            self._transport.write(data)

    def is_closing(self) -> bool:
        return not self.open or self._transport.is_closing()

    def close(self) -> None:
        close = self._close
        if close is None:
            self._transport.close()
        else:
            close()

    def abort(self) -> None:
        self._transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def detach(self) -> None:
        """The connection is gone: let go of the protocol (no reference cycle left for the collector)."""
        self._close = None


def drainable(cycle: RequestResponseCycle, limit: int) -> bool:
    """Whether the rest of ``cycle``'s body, answered before its end, can be read and dropped on a kept
    connection: its length is declared and at most ``limit``, and the client is not waiting for a
    100 Continue (it may never send the body)."""
    if cycle.waiting_for_100_continue:
        return False
    for name, value in cycle.scope["headers"]:
        if name == b"content-length":
            return value.isdigit() and int(value) <= limit
    return False  # chunked: where it ends is not known


def head_start(data: bytes, ended_with: bytes | None) -> int:
    """Where the request head that ``data`` (a read) ends inside, and that began in it, begins. httptools
    says nothing of positions, so it is found from the read's end: the head has no blank line yet, so it
    begins after the read's last one (which ended the request before it, or that request's head), or
    at 0; or, when that request ended with a body piece of declared length (``ended_with``, the last one
    in this read), where that piece ends, found from the blank line before it or inside it and checked
    against its bytes (empty lines sent between requests can only move the guess by that piece's size)."""
    blank = data.rfind(_BLANK_LINE)
    start = blank + len(_BLANK_LINE) if blank >= 0 else 0
    if ended_with is None:
        return start
    size = len(ended_with)
    inside = ended_with.rfind(_BLANK_LINE)
    end = blank - inside + size if inside >= 0 else start + size
    if size <= end <= len(data) and data.startswith(ended_with, end - size):
        return end
    return start


def path_of(url: bytes) -> str | None:
    """The path of a request's URL as uvicorn gives it to the app (escapes decoded); None when it is not
    ASCII (uvicorn refuses the request)."""
    path = url.partition(b"?")[0]
    if not path.isascii():
        return None
    text = path.decode("ascii")
    return urllib.parse.unquote(text) if "%" in text else text
