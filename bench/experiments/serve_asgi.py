"""``serve`` unchanged, except that the data routes go through uvicorn's stock httptools protocol and
the ASGI app (the path before the protocol-level fast path): the A/B for that change. Same flags as
``serve``."""

import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

import smtriton.serve.http.server
import smtriton.serve.http.worker
from bench.experiments import serve_variant


def _stock_protocol() -> None:
    smtriton.serve.http.server.data_protocol = lambda routes: HttpToolsProtocol  # type: ignore[assignment,misc]


def worker(index: int, channel: socket.socket) -> None:
    _stock_protocol()
    smtriton.serve.http.worker.run(index, channel)


if __name__ == "__main__":
    serve_variant.run("bench.experiments.serve_asgi:worker")
