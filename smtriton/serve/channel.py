"""The channel between `serve`'s main process and one front worker: JSON messages, both ways.

The main process owns the endpoint's state (Triton, the multi-model table, health, docs/design.md §3,
§4); a worker asks it (load, unload, list, describe) and is told of each change it must see before the
main process answers anyone (a model added, a model draining), and the state it answers from
(:class:`EndpointState`). One socketpair per worker, one JSON object per line. A call carries an id and
waits for the reply with that id; a notice carries none and gets no reply. Messages are taken in the
order they were sent; errors cross as their HTTP status and message, so a worker answers exactly what
the owner decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from smtriton.serve.errors import Relayed, ServeError

log = logging.getLogger("serve.channel")

Message = dict[str, Any]
# Called with (operation, message) in the order messages arrive, so what it does before returning
# happens in that order; it returns the result (any JSON value) or an awaitable of it, which runs
# concurrently with later messages. A ServeError becomes an error reply.
Handler = Callable[[str, Message], Any]
LINE_LIMIT = 64 * 1024 * 1024  # a model list of many thousand entries is one line


@dataclass(frozen=True)
class EndpointState:
    """What a worker needs to answer without asking: sent to every worker whenever it changes."""

    healthy: bool  # what /ping answers: 200 or 503
    serving: bool  # requests may go to Triton
    reason: str  # why not, while not serving (the 503's message)
    http_port: int | None  # Triton's loopback ports, new after each restart
    grpc_port: int | None
    decoupled: bool = False  # the SME model streams its responses

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, fields: dict[str, Any]) -> EndpointState:
        return cls(**fields)


STARTING = EndpointState(False, False, "Triton is starting", None, None)


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

    def _write(self, message: Message) -> None:
        if self.closed.is_set() or self._writer.is_closing():
            raise ChannelClosed("the channel is closed")
        self._writer.write(orjson.dumps(message) + b"\n")

    def notify(self, op: str, **fields: Any) -> None:
        """Send a notice (no reply); a closed channel drops it."""
        with contextlib.suppress(ChannelClosed):
            self._write({"op": op, **fields})

    async def call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        """Send a call and return its result; the other side's ServeError is raised here as the same
        status and message. Raises ChannelClosed when the other side goes away first, TimeoutError
        after ``timeout`` seconds."""
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            self._write({"op": op, "id": ident, **fields})
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
                message: Message = orjson.loads(line)
                if "reply" in message:
                    self._settle(message)
                else:
                    self._take(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._close()

    def _settle(self, message: Message) -> None:
        future = self._pending.get(message["reply"])
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(Relayed(int(message["status"]), str(message["error"])))
        else:
            future.set_result(message.get("result"))

    def _take(self, message: Message) -> None:
        """Hand one message to the handler now; reply now, or once what it returned is done."""
        try:
            result = self._handler(str(message.get("op")), message)
        except Exception as exc:
            self._reply(message, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.create_task(self._finish(message, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(message, result)

    async def _finish(self, message: Message, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except Exception as exc:
            result = exc
        self._reply(message, result)

    def _reply(self, message: Message, result: Any) -> None:
        ident = message.get("id")
        reply: Message
        if isinstance(result, ServeError):
            reply = {"reply": ident, "status": result.status, "error": result.message}
        elif isinstance(result, Exception):  # a bug on this side: the caller gets a 500, this log the traceback
            log.error("handling %r over the worker channel failed", message.get("op"), exc_info=result)
            reply = {"reply": ident, "status": 500, "error": f"internal error: {result.__class__.__name__}"}
        else:
            reply = {"reply": ident, "result": result}
        if ident is not None:
            with contextlib.suppress(ChannelClosed):
                self._write(reply)

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
