"""File descriptors: how many a process may open, and a watch that says when they have run out.

A front worker holds one descriptor a client connection. When none is left, the kernel still
completes connections into the listening socket's queue, but the worker cannot accept them: uvloop
(libuv) accepts each into a descriptor it kept in reserve and closes it at once, asyncio retries each
second, and neither tells anyone; clients see resets and timeouts, `/ping` included. So each worker
checks, once a second, whether it could open one more descriptor, and logs when it cannot (then once
a minute while it lasts) and when it can again, with the connections it holds and its limit.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
from collections.abc import Callable

log = logging.getLogger("serve")

CHECK_INTERVAL_S = 1.0
REPEAT_S = 60.0


def limit() -> int:
    """The most descriptors this process may have open (its soft ``RLIMIT_NOFILE``)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def exhausted() -> bool:
    """Whether this process could not open one more descriptor now (its own limit, or the system's)."""
    try:
        os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        raise
    return False


async def watch(connections: Callable[[], int], interval: float = CHECK_INTERVAL_S) -> None:
    """Log while this process is out of descriptors (new connections are refused meanwhile);
    ``connections`` counts the client connections it holds. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    since: float | None = None  # when it ran out
    said = 0.0  # when it last said so
    while True:
        await asyncio.sleep(interval)
        now = loop.time()
        if exhausted():
            if since is None or now - said >= REPEAT_S:
                log.error(
                    "out of file descriptors (limit %d): new connections are refused while this worker holds %d "
                    'client connections; raise the limit (ulimit -n) or see docs/operations.md, "Slow clients"',
                    limit(),
                    connections(),
                )
                said = now
            since = since if since is not None else now
        elif since is not None:
            log.warning("file descriptors available again after %.0f s; accepting connections", now - since)
            since = None
