"""The channel between `serve`'s main process and one front worker: typed messages, both ways.

The main process owns the endpoint's state (Triton, the multi-model table, health, docs/design.md §3a);
a worker asks it (load, unload, list, describe, sessions) and is told of each change it must see
before the main process answers anyone, and the state it answers from. The messages are declared once
in :mod:`smtriton.serve.ipc.messages`. One socketpair per worker, one JSON object per line: a call carries
an id and waits for the reply with that id; a notice carries none and gets no reply. Messages are taken
in the order they were sent; errors cross as their HTTP status and message, so a worker answers
exactly what the owner decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson

from smtriton.serve.errors import BadRequest, Relayed, ServeError, readable
from smtriton.serve.ipc.messages import Call, Message, UnknownMessage

log = logging.getLogger("serve.channel")

R = TypeVar("R")
# Called with each message in the order messages arrive, so what it does before returning happens in
# that order; it returns the result (any JSON value) or an awaitable of it, which runs concurrently
# with later messages. A ServeError becomes an error reply.
Handler = Callable[[Message], Any]
LINE_LIMIT = 64 * 1024 * 1024  # a model list of many thousand entries is one line


class ChannelClosed(ConnectionError):
    """The other side is gone (a worker that died, a main process that stopped)."""


class Channel:
    """One end of a worker's channel. ``handler`` answers the other side's calls and notices;
    :meth:`run` reads until the other side closes (then every pending call fails with
    :class:`ChannelClosed`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, sock: socket.socket, handler: Handler) -> Channel:
        reader, writer = await asyncio.open_connection(sock=sock, limit=LINE_LIMIT)
        return cls(reader, writer, handler)

    def _write(self, line: dict[str, Any]) -> None:
        if self.closed.is_set() or self._writer.is_closing():
            raise ChannelClosed("the channel is closed")
        self._writer.write(orjson.dumps(line) + b"\n")

    def notify(self, message: Message) -> None:
        """Send ``message`` as a notice (no reply); a closed channel drops it."""
        with contextlib.suppress(ChannelClosed):
            self._write({"op": message.op, "args": message})

    async def call(self, message: Call[R], timeout: float | None = None) -> R:
        """Send ``message`` and return its reply; the other side's ServeError is raised here as the same
        status and message. Raises ChannelClosed when the other side goes away first, TimeoutError
        after ``timeout`` seconds."""
        ident = next(self._ids)
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            self._write({"op": message.op, "id": ident, "args": message})
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(ident, None)

    async def run(self) -> None:
        """Read messages until the other side closes; calls are answered concurrently."""
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    return
                received: dict[str, Any] = orjson.loads(line)
                if "reply" in received:
                    self._settle(received)
                else:
                    self._take(received)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._close()

    def _settle(self, reply: dict[str, Any]) -> None:
        future = self._pending.get(reply["reply"])
        if future is None or future.done():
            return
        if "error" in reply:
            future.set_exception(Relayed(int(reply["status"]), str(reply["error"])))
        else:
            future.set_result(reply.get("result"))

    def _take(self, received: dict[str, Any]) -> None:
        """Hand one message to the handler now; reply now, or once what it returned is done."""
        ident, op = received.get("id"), str(received.get("op"))
        try:
            result = self._handler(Message.from_wire(op, received.get("args") or {}))
        except UnknownMessage as exc:
            self._reply(ident, op, BadRequest(str(exc)))
            return
        except Exception as exc:
            self._reply(ident, op, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.create_task(self._finish(ident, op, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(ident, op, result)

    async def _finish(self, ident: int | None, op: str, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except Exception as exc:
            result = exc
        self._reply(ident, op, result)

    def _reply(self, ident: int | None, op: str, result: Any) -> None:
        reply: dict[str, Any]
        if isinstance(result, ServeError):
            reply = {"reply": ident, "status": result.status, "error": readable(result.message)}
        elif isinstance(result, Exception):  # a bug on this side: the caller gets a 500, this log the traceback
            log.error("handling %r over the worker channel failed", op, exc_info=result)
            reply = {"reply": ident, "status": 500, "error": f"internal error: {result.__class__.__name__}"}
        else:
            reply = {"reply": ident, "result": result}
        if ident is not None:
            with contextlib.suppress(ChannelClosed):
                try:
                    self._write(reply)
                except orjson.JSONEncodeError as exc:  # a result JSON cannot carry: answered all the same
                    log.error("the reply to %r could not be written: %s", op, exc)
                    self._write({"reply": ident, "status": 500, "error": f"internal error: {exc.__class__.__name__}"})

    def _close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelClosed("the other side of the channel went away"))
        self._writer.close()

    async def close(self) -> None:
        """Close this end; the other side's reader sees the end of the stream."""
        self._close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
