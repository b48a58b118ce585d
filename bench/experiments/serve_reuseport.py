"""``serve`` with 2 front workers that each listen on a socket of their own with ``SO_REUSEPORT`` (the
kernel spreads connections over them by a hash of the addresses) instead of accepting on the one
socket the main process bound: the A/B of how workers share the port. Same flags as ``serve``."""

import os
import socket

import smtriton.serve.cli
import smtriton.serve.worker
from bench.experiments import serve_variant
from smtriton.serve.settings import Settings


def _reserve(host: str, port: int) -> socket.socket:
    """The main process holds the port (bound, never listening, so no connection waits on it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _own_socket(inherited: socket.socket, settings: Settings) -> socket.socket:
    inherited.close()
    return socket.create_server((settings.host, settings.port), reuse_port=True, backlog=2048)


def worker(index: int, channel: socket.socket, listener: socket.socket) -> None:
    smtriton.serve.worker.listening_socket = _own_socket
    smtriton.serve.worker.run(index, channel, listener)


if __name__ == "__main__":
    os.environ.setdefault("SAGEMAKER_MODEL_SERVER_WORKERS", "2")
    smtriton.serve.cli.listen = _reserve  # type: ignore[assignment]
    serve_variant.run("bench.experiments.serve_reuseport:worker")
