"""One front worker: uvicorn on the SageMaker port that the main process bound, for the one Triton.

The main process's worker pool (:mod:`smtriton.serve.owner.pool`) forks it from multiprocessing's fork
server, which imported this module while Triton started, and calls :func:`run` with the worker's end of
the channel. It waits for the main process's first message (settings, state, models) before it listens
on the port (a socket of its own beside the other workers'), so that it answers like every other
worker from its first request.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import signal
import socket
from typing import Any

from smtriton.serve import eventloop
from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.host import descriptors, memory
from smtriton.serve.http.server import http_server
from smtriton.serve.http.sockets import listen
from smtriton.serve.ipc.channel import Channel
from smtriton.serve.ipc.messages import Hello, Message, ModelAdded
from smtriton.serve.logs import configure_logging
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings

log = logging.getLogger("serve")

# Connections to Triton that all workers together keep at most (each worker a share of it, never below
# what one worker needs to keep its event loop busy).
UPSTREAM_CONNECTIONS = 256
MIN_UPSTREAM_CONNECTIONS = 16
PR_SET_PDEATHSIG = 1


def upstream_pool_size(workers: int) -> int:
    """How many connections to Triton one of ``workers`` front workers keeps at most."""
    return max(MIN_UPSTREAM_CONNECTIONS, UPSTREAM_CONNECTIONS // workers)


def run(index: int, channel: socket.socket) -> None:
    """Serve as worker ``index`` until SIGTERM; exit status 0 after a drain, 1 if the main process went
    away before it said hello."""
    # Never outlive `serve`: the fork server this runs under ends with the main process.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    raise SystemExit(eventloop.run(_serve(channel)))


async def _serve(channel_socket: socket.socket) -> int:
    hello: asyncio.Future[DataPlane] = asyncio.get_running_loop().create_future()

    def handle(message: Message) -> Any:
        if isinstance(message, Hello):  # the first message: the plane is built before the next one is taken
            hello.set_result(_plane(message, channel))
            return None
        return hello.result().handle(message)

    channel = await Channel.open(channel_socket, handle)
    reader = asyncio.create_task(channel.run(), name="channel")
    # The worker's imports are done: wait for the main process to say hello.
    waits: list[asyncio.Future[Any]] = [hello, reader]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if not hello.done():  # it went away before saying anything: nothing to serve for
        return 1
    plane = hello.result()
    server = http_server(plane)

    def owner_gone(_: asyncio.Task[None]) -> None:
        if not server.should_exit:
            log.error("the main process closed this worker's channel; stopping")
            plane.begin_drain()
            server.should_exit = True

    reader.add_done_callback(owner_gone)
    # Out of descriptors, connections are refused without a word from the event loop: say so.
    watchers = [asyncio.create_task(descriptors.watch(lambda: len(server.server_state.connections)))]
    if memory.keep_freed(plane.settings.worker_keep_freed_bytes):  # and given back when there is no work
        watchers.append(asyncio.create_task(memory.give_back_when_idle()))
    try:
        await server.serve(sockets=[listen(plane.settings.host, plane.settings.port)])
    finally:
        for watcher in watchers:
            watcher.cancel()
        reader.remove_done_callback(owner_gone)
        await channel.close()
    return 0


def _plane(hello: Hello, owner: Channel) -> DataPlane:
    """This worker's data plane, as the main process's first message describes it."""
    settings = Settings.model_validate(hello.settings)
    configure_logging(settings.log_level, settings.log_format, worker=hello.index)
    plane = DataPlane(
        settings,
        Metrics(enabled=settings.metrics_port is not None),
        hello.default_model,
        owner=owner,
        pool_size=upstream_pool_size(settings.workers),
    )
    for record in hello.models:
        plane.handle(ModelAdded(record))
    plane.apply(hello.state)  # no clients yet: nothing to close
    return plane
