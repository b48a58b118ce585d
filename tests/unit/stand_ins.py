"""Stand-ins for the two sides a worker's data plane talks to besides Triton's HTTP API: the endpoint's
owner (a recording channel) and Triton's stream of responses to a decoupled model's request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from smtriton.serve.ipc.messages import Message

# One response of a decoupled model, as Triton's stream gives it.
OUT = {"model_name": "m", "outputs": [{"name": "OUT", "datatype": "INT32", "shape": [1], "data": [1]}]}


class RecordingOwner:
    """The owner's side of the channel, recording what a worker tells it and how."""

    def __init__(self, answers: dict[str, object] | None = None) -> None:
        self.said: list[tuple[str, str]] = []
        self.messages: list[Message] = []
        self.answers = answers or {}  # what a call answers, by operation (None when not given)

    async def call(self, message: Message, timeout: float | None = None) -> object:
        self.said.append(("call", message.op))
        self.messages.append(message)
        return self.answers.get(message.op)

    def notify(self, message: Message) -> None:
        self.said.append(("notice", message.op))
        self.messages.append(message)


class TritonStream:
    """Triton's side of a streamed answer as the data plane gets it (``generator``, an async generator,
    as ``DataPlane.stream`` returns): it yields ``items``, then raises ``then`` if given, or with
    ``hold`` waits for a response that never comes (``waiting`` says it got there)."""

    def __init__(self, items: list[dict[str, Any]], then: BaseException | None = None, hold: bool = False) -> None:
        self.items = items
        self.then = then
        self.hold = hold
        self.started = False
        self.ended = False  # its clean-up ran: the gRPC call would be cancelled
        self.waiting = asyncio.Event()
        self.generator = self._run()

    async def _run(self) -> AsyncGenerator[dict[str, Any], None]:
        self.started = True
        try:
            for item in self.items:
                yield item
            if self.hold:
                self.waiting.set()
                await asyncio.Event().wait()
            if self.then is not None:
                raise self.then
        finally:
            self.ended = True

    @property
    def closed(self) -> bool:
        """Closed or finished: it can yield nothing more (also when it was closed before it started)."""
        return self.generator.ag_frame is None
