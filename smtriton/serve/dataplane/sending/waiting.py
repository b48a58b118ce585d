"""Waiting for Triton: a Triton crash costs latency, not answers.

When Triton dies the endpoint's owner restarts it (and loads the multi-model endpoint's models again)
and tells every worker each change of state. A stateless inference (no session, not streamed) that
meets Triton down or restarting waits here until a Triton serves again — within the request's own
timeout, and at most :attr:`Waiting.limit` of them a worker (past it, 503 at once) — instead of failing.
One that was in flight when its Triton died is sent again once the next Triton serves; a request in
flight at two deaths in a row is not sent a third time (it may be what kills Triton: the data plane
answers it 500). A request of a sequence (a session's, or one it sets itself) never waits here: the next
Triton holds none of its sequence. ``SMTRITON_WAIT_FOR_TRITON=false`` answers 503 at once, as before.

:meth:`Waiting.send` is that path, the one every stateless Triton request takes: a single request, and each
Triton request of a body of several records (a record alone, a merged group of them, a slice of CSV rows),
so a body's records already answered are kept and only those still unanswered wait and go again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from smtriton.serve.dataplane.sending.mirror import EndpointMirror
from smtriton.serve.errors import KilledTriton, NotReady, TritonUnavailable
from smtriton.serve.settings import Settings

log = logging.getLogger("serve")
T = TypeVar("T")
# A turn on probation, held while the block runs, its wait ending at the deadline given (a
# :func:`time.monotonic` reading): the owner's, through :class:`~smtriton.serve.dataplane.sending.owner_link.OwnerLink`.
Probation = Callable[[float], contextlib.AbstractAsyncContextManager[None]]

# How long a worker may take to hear of a Triton death after a request to it failed unreachable: the
# owner notices the process's exit at once and tells every worker within milliseconds.
DEATH_GRACE_S = 2.0


class Waiting:
    """The requests of one worker that wait for Triton to serve again."""

    def __init__(self, settings: Settings, mirror: EndpointMirror, probation: Probation) -> None:
        self.enabled = settings.wait_for_triton
        self.limit = settings.triton_wait_queue
        self.mirror = mirror
        self.probation = probation
        self.waiting = 0

    def serving(self, newer_than: int | None = None) -> bool:
        """Whether requests may go to Triton now (to one started after the one of generation
        ``newer_than``, when given)."""
        state = self.mirror.state
        return state.serving and (newer_than is None or state.generation > newer_than)

    def _may_wait(self) -> bool:
        """Whether Triton is worth waiting for: it serves, or one that served is being restarted (not
        before the first Triton served, after a model failed to come back, or while the endpoint stops)."""
        state = self.mirror.state
        return self.enabled and not self.mirror.draining and (state.serving or state.returning)

    async def until_serving(self, deadline: float, newer_than: int | None = None) -> None:
        """Return once requests may go to Triton (to a Triton started after the one of generation
        ``newer_than``, when given). 503 when waiting is off, nothing is worth waiting for (see
        :meth:`_may_wait`), the worker drains, its queue is full, or ``deadline`` (a :func:`time.monotonic`
        reading) passes first."""
        if self.serving(newer_than):
            return
        reason = self.mirror.state.reason or "Triton is not ready"
        if not self._may_wait():
            raise NotReady(reason)
        if self.waiting >= self.limit:
            raise NotReady(f"{reason} ({self.limit} requests already wait for Triton on this front worker)")
        self.waiting += 1
        try:
            while not self.serving(newer_than):
                if not self._may_wait():
                    raise NotReady(self.mirror.state.reason or reason)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NotReady(f"{self.mirror.state.reason or reason}: Triton was not back in time")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.mirror.changed.wait(), remaining)
        finally:
            self.waiting -= 1

    async def died(self, generation: int, deadline: float) -> bool:
        """After a request to the Triton of ``generation`` found it unreachable: whether that Triton died
        (the owner says so within :data:`DEATH_GRACE_S`, and before the request's ``deadline``), rather
        than only the connection."""
        deadline = min(deadline, time.monotonic() + DEATH_GRACE_S)
        while self.mirror.state.generation == generation and self.mirror.state.serving:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.mirror.changed.wait(), remaining)
            except asyncio.TimeoutError:
                return False
        return True

    async def send(self, call: Callable[[], Awaitable[T]], deadline: float, model: str, size: int) -> T:
        """``call`` (a stateless request of ``size`` bytes to ``model``), which a Triton death costs time,
        not its answer: it waits for a Triton that serves, and is made again once if its Triton died under
        it, on probation (alone among the requests sent again, on the whole endpoint); one in flight at two
        deaths in a row is answered 500, never sent a third time. Its turn on probation is asked for once a
        Triton serves, and given back if Triton died again before it came: a turn taken sooner would run
        out its lease while Triton restarts, and let several suspects go together. Every wait ends at
        ``deadline``."""
        newer_than: int | None = None  # once it was in flight at a death: that Triton's generation
        while True:
            await self.until_serving(deadline, newer_than)
            turn: contextlib.AbstractAsyncContextManager[None] = (
                contextlib.nullcontext() if newer_than is None else self.probation(deadline)
            )
            async with turn:
                if not self.serving(newer_than):
                    continue  # Triton died again while this waited for its turn, which goes back meanwhile
                generation = self.mirror.state.generation
                try:
                    return await call()
                except TritonUnavailable as exc:
                    if not self.enabled or not await self.died(generation, deadline):
                        raise
                    if not exc.sent:  # it never reached Triton: nothing to suspect it of
                        continue
                    if newer_than is not None:
                        log.error(
                            "a request to model %s (%d bytes) was in flight at two Triton deaths in a row: "
                            "answered 500, not sent again",
                            model,
                            size,
                        )
                        raise KilledTriton(
                            "Triton died twice in a row while running this request, the second time with no "
                            "other request under suspicion: it is not sent again (it may be what crashes the "
                            "model)"
                        ) from None
                    newer_than = generation

    async def ask(self, question: Callable[[], Awaitable[T]], deadline: float) -> T:
        """What a body of several records must know of its model before any record goes (its configuration),
        asked of a Triton that serves: waited for as a request is, and asked again of the next Triton when
        the one asked died meanwhile (a question that reads a configuration is no suspect)."""
        while True:
            await self.until_serving(deadline)
            generation = self.mirror.state.generation
            try:
                return await question()
            except TritonUnavailable:
                if not self.enabled or not await self.died(generation, deadline):
                    raise
