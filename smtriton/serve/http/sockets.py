"""The SageMaker port: held by the main process for the workers, listened on by each worker.

Each worker listens on a socket of its own bound with ``SO_REUSEPORT``, so the kernel spreads new
connections over the workers by their addresses (docs/design.md §3a); the main process first makes sure
nobody else holds the port, and keeps a reservation that never listens.
"""

from __future__ import annotations

import ipaddress
import socket

from smtriton.serve.errors import StartupError

BACKLOG = 2048  # uvicorn's default


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a host name: IPv4, as uvicorn resolves it by default
        return socket.AF_INET


def reserve_port(host: str, port: int) -> socket.socket:
    """Hold the SageMaker port for the workers' sockets (StartupError when it is taken).

    A plain bind first, so that a port any other socket holds, a ``SO_REUSEPORT`` one of another
    `serve` included, is refused instead of shared; then the reservation: bound with ``SO_REUSEPORT``,
    never listening, so no connection waits on it while it keeps the port for the workers."""
    family = _family(host)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
        reservation = socket.socket(family, socket.SOCK_STREAM)
        reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reservation.bind((host, port))
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return reservation


def listen(host: str, port: int) -> socket.socket:
    """A worker's own listening socket on the SageMaker port, beside the other workers' (``SO_REUSEPORT``)."""
    return socket.create_server((host, port), family=_family(host), backlog=BACKLOG, reuse_port=True)
