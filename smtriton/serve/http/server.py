"""uvicorn as `serve` runs it: the drain on SIGTERM, and the server assembled around one data plane.

The drain loses no request a client has sent. Closing a listening socket resets the connections the
kernel queued on it and the worker had not accepted yet, and uvicorn's shutdown closes every accepted
connection that has no request under way, also one whose request is still arriving: either way a
client's request is dropped after it was written. So before uvicorn's shutdown the worker first has
the kernel drop new connection attempts on its socket (a socket filter that discards SYNs: the client
retries, and finds the port closed), accepts what is queued, and lets the requests on the way arrive
(bounded); only then are the socket and the idle connections closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import struct
import threading
from collections.abc import Iterator

import uvicorn

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.http.app import create_app
from smtriton.serve.http.fastpath import data_protocol
from smtriton.serve.http.protocol import EdgeProtocol

log = logging.getLogger("serve")

_SO_ATTACH_FILTER = 26
_TCP_INFO_UNACKED = 24  # tcp_info.tcpi_unacked: on a listening socket, its queue of accepted connections


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


# Classic BPF over the TCP header: a SYN without ACK (a new connection) is dropped, anything else kept
# (the handshakes under way complete, and connections accepted later inherit the filter harmlessly).
_DROP_NEW_CONNECTIONS = (_Instruction * 5)(
    _Instruction(0x30, 0, 0, 13),  # ldb [13]: the TCP flags
    _Instruction(0x45, 2, 0, 0x10),  # jset ACK: keep
    _Instruction(0x45, 0, 1, 0x02),  # jset SYN: drop, else keep
    _Instruction(0x06, 0, 0, 0),  # ret 0: drop
    _Instruction(0x06, 0, 0, 0xFFFFFFFF),  # ret all: keep
)


def refuse_new_connections(sock: socket.socket) -> bool:
    """Have the kernel drop new connection attempts on the listening ``sock`` while what it queued can
    still be accepted; False where this kernel does not allow it."""
    program = _Program(len(_DROP_NEW_CONNECTIONS), ctypes.cast(_DROP_NEW_CONNECTIONS, ctypes.POINTER(_Instruction)))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(program))
    except OSError as exc:
        log.warning("cannot hold new connections off while draining (%s): queued ones may be reset", exc)
        return False
    return True


def queued_connections(sock: socket.socket) -> int:
    """Connections the kernel completed on the listening ``sock`` and nobody has accepted yet."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_UNACKED + 4)
    except OSError:
        return 0
    return int(struct.unpack_from("I", info, _TCP_INFO_UNACKED)[0])


class DrainingServer(uvicorn.Server):
    """uvicorn, except that a SIGTERM/SIGINT drain ends with status 0 (uvicorn re-raises the signal),
    tells the data plane at once, so /ping fails while in-flight requests finish, and loses no request
    a client sent (the module's docstring)."""

    def __init__(self, config: uvicorn.Config, plane: DataPlane) -> None:
        super().__init__(config)
        self._plane = plane

    def handle_exit(self, sig: int, frame: object) -> None:
        self._plane.begin_drain()
        super().handle_exit(sig, frame)  # type: ignore[arg-type]

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._take_what_was_sent(sockets or [])
        await super().shutdown(sockets)

    async def _take_what_was_sent(self, listeners: list[socket.socket]) -> None:
        """New connections held off; the queued ones accepted and their requests arrived (or the grace
        ran out), before uvicorn closes the sockets and the idle connections."""
        if not listeners or not all([refuse_new_connections(sock) for sock in listeners]):
            return
        loop = asyncio.get_running_loop()
        # a client connected this long without sending its request is closed as before
        deadline = loop.time() + self._plane.settings.stop_budget().accept_grace_s
        while loop.time() < deadline:
            arriving = any(
                isinstance(connection, EdgeProtocol) and connection.awaiting_request()
                for connection in self.server_state.connections
            )
            if not arriving and not any(queued_connections(sock) for sock in listeners):
                return
            await asyncio.sleep(0.01)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def http_server(plane: DataPlane) -> DrainingServer:
    """The HTTP server for ``plane``, on the SageMaker port."""
    settings = plane.settings
    routes = create_app(plane)
    config = uvicorn.Config(
        routes,
        http=data_protocol(plane),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        access_log=settings.access_log,
        server_header=False,
        timeout_graceful_shutdown=settings.stop_budget().graceful_s,  # type: ignore[arg-type]  # uvicorn hands it to asyncio.wait_for
        lifespan="on",
    )
    return DrainingServer(config, plane)
