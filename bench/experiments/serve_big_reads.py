"""``serve`` unchanged, except that uvicorn stops reading a request body only past 4 MiB buffered
instead of 64 KiB: a test of whether its pause/resume round trips cost large bodies (NOTES.md,
"Large bodies"). Same flags as ``serve``."""

import socket

import uvicorn.protocols.http.h11_impl
import uvicorn.protocols.http.httptools_impl

import smtriton.serve.http.worker
from bench.experiments import serve_variant


def _big_reads() -> None:
    for module in (uvicorn.protocols.http.httptools_impl, uvicorn.protocols.http.h11_impl):
        module.HIGH_WATER_LIMIT = 4 * 1024 * 1024  # type: ignore[attr-defined]


def worker(index: int, channel: socket.socket) -> None:
    _big_reads()
    smtriton.serve.http.worker.run(index, channel)


if __name__ == "__main__":
    serve_variant.run("bench.experiments.serve_big_reads:worker")
