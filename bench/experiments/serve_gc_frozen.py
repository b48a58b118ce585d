"""``serve`` unchanged, except that the garbage collector is frozen after start-up imports.

``gc.freeze()`` moves every object alive at that point (FastAPI, pydantic, aiohttp, numpy modules...)
to a permanent generation, so a full collection no longer walks them: a test for whether the p99 tail
under load is collector pauses. Same flags as ``serve``.
"""

import gc
import socket

import smtriton.serve.http.worker
from bench.experiments import serve_variant


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def worker(index: int, channel: socket.socket) -> None:
    _freeze()
    smtriton.serve.http.worker.run(index, channel)


if __name__ == "__main__":
    serve_variant.run("bench.experiments.serve_gc_frozen:worker")
