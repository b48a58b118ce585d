"""How a long-lived process of `serve` runs: on which event loop, and with which heap frozen.

`serve`'s main process, each front worker and the benchmark's client (``smtriton perf``) start their
loop here, and the workers' fork server and each worker freeze their heap here, so that each choice is
made once; an object that serves one loop keeps it (:class:`LoopOfFirstUse`).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on uvloop, uvicorn's loop of choice (about half asyncio's cost per
    request), or on asyncio's own loop where uvloop is not installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the runtime's dependencies
        return asyncio.run(main)
    return uvloop.run(main)


class LoopOfFirstUse:
    """The event loop an object serves: the loop running at its first use, asked of asyncio that once.
    asyncio's own look-up is a ``getpid`` system call each time on Python 3.11 and before, and the
    request path would ask it several times a request (bench/NOTES.md Part 20)."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop


def freeze_heap() -> None:
    """Collect once, then move every object alive now out of the collector's passes: they live as long
    as the process. A full pass writes to each object it visits, which costs pauses on the hot path
    (bench/NOTES.md: 57 ms pauses, p99 55 → 8 ms) and, in a fork server, copies the pages its forked
    children share (about 15 MiB more private memory a worker, measured)."""
    gc.collect()
    gc.freeze()
