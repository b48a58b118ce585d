"""The one reader of request bodies: held once as they arrive, refused (413) once they pass the limit.

The protocol's fast path feeds a reader from the HTTP parser's callbacks (:meth:`BodyReader.feed`,
:meth:`~BodyReader.finish`, :meth:`~BodyReader.lost`); the ASGI side lets it pull the body from
``receive``. Either way the route reads it with one call, :meth:`BodyReader.read`, refused at once when
the Content-Length already passes the limit, and as soon as the body does while it streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive

from smtriton.serve.errors import BadRequest, ClientGone, PayloadTooLarge
from smtriton.serve.triton.request_body import BodyPieces, HeldBody

# A body's pieces smaller than this are joined as they come, into buffers of at least this size; larger
# ones are kept as they came. Kept apart, a trickle of small pieces costs many times its bytes (an object
# and a list slot each: 200 connections sending 1-byte segments held 30 MiB for 3.4 MB), while a copy
# of a small piece costs next to nothing.
JOIN_BELOW = 16 * 1024


def check_declared_length(content_length: bytes | None, limit: int) -> None:
    """Refuse a body whose Content-Length already says it passes ``limit`` (413), before reading it."""
    if content_length is not None:
        if not content_length.isdigit():
            raise BadRequest("invalid Content-Length")
        if int(content_length) > limit:
            raise PayloadTooLarge(limit)


class BodyReader:
    """A request body as it arrives, held once. Most bodies arrive in one piece, kept as it came; a body
    in several pieces is kept as those pieces (:class:`~smtriton.serve.triton.request_body.BodyPieces`),
    never copied as it grows: a buffer grown piece by piece copied a 600 KB body into fresh pages over
    and over (0.4 ms of front CPU, bench/NOTES.md Part 12), and joining it at the end would hold a 1 GiB
    body twice. Only small pieces (:data:`JOIN_BELOW`) are copied, into a buffer of their own that is
    closed once that large: a body trickled in tiny pieces is held in about its bytes. Only what needs
    the whole body as one buffer joins the pieces; a binary request goes to Triton as them.

    ``pull``: the ASGI ``receive`` to read the body from (None: it is fed); ``before_wait``: called
    before waiting for a fed body (the fast path answers ``Expect: 100-continue`` and resumes reading)."""

    __slots__ = (
        "_arrived", "_before_wait", "_first", "_joining", "_pieces", "_pull", "complete", "declared", "gone",
        "limit", "size", "too_large",
    )  # fmt: skip

    def __init__(self, limit: int, pull: Receive | None = None, before_wait: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.declared: bytes | None = None  # the request's Content-Length, as sent
        self.size = 0
        self.too_large = False
        self.complete = False
        self.gone = False
        self._first = b""
        self._pieces: list[bytes] | None = None  # the pieces, once there is more than one
        self._joining: bytes | bytearray | None = None  # the small pieces after them, joined as they come
        self._pull = pull
        self._before_wait = before_wait
        self._arrived: asyncio.Event | None = None

    # ----- fed by the protocol ---------------------------------------------------------------------
    def feed(self, piece: bytes) -> None:
        """A piece of the body; past the limit the rest is dropped and the reader woken (413 now, not
        after the whole body)."""
        if self.too_large:
            return
        self.size += len(piece)
        if self.size > self.limit:
            self.too_large = True
            self._first, self._pieces, self._joining = b"", None, None
            self._wake()
        elif self._pieces is not None:
            if len(piece) >= JOIN_BELOW and self._joining is None:
                self._pieces.append(piece)  # a large body's pieces: kept as they came, at once
            elif piece:
                self._keep(self._pieces, piece)
        elif not self._first:
            self._first = piece
        elif piece:
            first, self._first = self._first, b""
            if len(first) >= JOIN_BELOW and len(piece) >= JOIN_BELOW:
                self._pieces = [first, piece]
            else:
                pieces: list[bytes] = []
                self._pieces = pieces
                self._keep(pieces, first)
                self._keep(pieces, piece)

    def _keep(self, pieces: list[bytes], piece: bytes) -> None:
        """``piece`` after the others: a large one as it came, a small one joined to the small ones
        just before it (closed, a piece of its own, once :data:`JOIN_BELOW` large). A lone small piece
        is kept as it came (a large body's last piece, say): copied only when another joins it."""
        joining = self._joining
        if len(piece) >= JOIN_BELOW:
            if joining is not None:
                pieces.append(bytes(joining))
                self._joining = None
            pieces.append(piece)
        elif joining is None:
            self._joining = piece
        else:
            if not isinstance(joining, bytearray):
                joining = self._joining = bytearray(joining)
            joining += piece
            if len(joining) >= JOIN_BELOW:
                pieces.append(bytes(joining))
                self._joining = None

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def lost(self) -> None:
        """The connection went away before the body was whole."""
        self.gone = True
        self._wake()

    def _wake(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    def answered(self) -> None:
        """The request has its answer: let go of ``before_wait``. It is a method of the request's cycle,
        which holds this reader: kept, the pair (and the dozen objects of the request they hold) would
        be freed only by the garbage collector's passes, some 3.5 µs of a worker's CPU a request
        (bench/NOTES.md Part 21)."""
        self._before_wait = None

    # ----- read by the route ---------------------------------------------------------------------------
    async def read(self) -> HeldBody:
        """The whole body (and the reader emptied); 413 past the limit, 400 for an invalid Content-Length."""
        check_declared_length(self.declared, self.limit)
        if self._pull is not None:
            await self._pull_all(self._pull)
        elif not (self.complete or self.too_large or self.gone):
            if self._before_wait is not None:
                self._before_wait()
            self._arrived = asyncio.Event()
            await self._arrived.wait()
        if self.too_large:
            raise PayloadTooLarge(self.limit)
        if self.gone:
            raise ClientGone()
        pieces = self._pieces
        body: HeldBody = self._first
        if pieces is not None:
            if self._joining is not None:
                pieces.append(bytes(self._joining))
            body = BodyPieces(pieces, self.size) if len(pieces) > 1 else pieces[0]
        self._first, self._pieces, self._joining, self.size = b"", None, None, 0
        return body

    async def _pull_all(self, receive: Receive) -> None:
        while not self.complete:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.lost()
                return
            self.feed(message.get("body", b""))
            if self.too_large:
                return
            if not message.get("more_body"):
                self.finish()
