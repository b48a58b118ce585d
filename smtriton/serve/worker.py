"""One front worker: uvicorn on the SageMaker port that the main process bound, for the one Triton.

Started by the main process (:mod:`smtriton.serve.workers`) as ``python -m smtriton.serve.worker``
with the listening socket and its end of the channel as inherited file descriptors. Its imports run
while Triton starts; it then waits for the main process's first message (settings, state, models)
before it accepts a connection, so that it answers like every other worker from its first request.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from collections.abc import Sequence
from typing import Any

from smtriton.serve.channel import Channel, EndpointState, Message
from smtriton.serve.dataplane import DataPlane
from smtriton.serve.logs import configure_logging
from smtriton.serve.metrics import Metrics
from smtriton.serve.server import http_server
from smtriton.serve.settings import Settings

log = logging.getLogger("serve")

# Connections to Triton that all workers together keep at most (each worker a share of it).
UPSTREAM_CONNECTIONS = 256


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="smtriton.serve.worker", description="a front worker of `serve`")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the runtime's dependencies
        code = asyncio.run(_serve(args.index, args.channel_fd, args.listen_fd))
    else:
        code = uvloop.run(_serve(args.index, args.channel_fd, args.listen_fd))
    raise SystemExit(code)


async def _serve(index: int, channel_fd: int, listen_fd: int) -> int:
    hello: asyncio.Future[DataPlane] = asyncio.get_running_loop().create_future()

    def handle(op: str, message: Message) -> Any:
        if op == "hello":  # the first message: the plane is built before the next one is taken
            hello.set_result(_plane(index, message, channel))
            return None
        return hello.result().handle(op, message)

    channel = await Channel.open(socket.socket(fileno=channel_fd), handle)
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
    try:
        await server.serve(sockets=[socket.socket(fileno=listen_fd)])
    finally:
        reader.remove_done_callback(owner_gone)
        await channel.close()
    return 0


def _plane(index: int, hello: Message, owner: Channel) -> DataPlane:
    """This worker's data plane, as the main process's first message describes it."""
    settings = Settings.model_validate(hello["settings"])
    configure_logging(settings.log_level, settings.log_format, worker=index)
    plane = DataPlane(
        settings,
        Metrics(enabled=settings.metrics_port is not None),
        hello["default_model"],
        owner=owner,
        pool_size=max(16, UPSTREAM_CONNECTIONS // settings.workers),
    )
    for record in hello["models"]:
        plane.handle("model_added", {"record": record})
    plane.apply(EndpointState.from_wire(hello["state"]))  # no clients yet: nothing to close
    return plane


if __name__ == "__main__":
    main(sys.argv[1:])
