"""What a front worker asks of the endpoint's owner in the main process, over the worker's channel.

Everything the workers must agree on is decided there (docs/design.md §3a): the multi-model API (load,
unload, list, describe), the sessions' table, the out-of-memory verdict on a failed invoke and the
turns on probation after a Triton death. Each question is a typed message
(:mod:`smtriton.serve.ipc.messages`); a channel that is gone is a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from smtriton.serve.errors import BadRequest, NotReady
from smtriton.serve.ipc.channel import Channel, ChannelClosed
from smtriton.serve.ipc.messages import (
    Call,
    CloseSession,
    DescribeModel,
    InvokeFailed,
    ListModels,
    LoadModel,
    OpenedSession,
    OpenSession,
    Probation,
    ProbationOver,
    SessionAnswered,
    UnloadModel,
    UsedSession,
    UseSession,
)

R = TypeVar("R")


class OwnerLink:
    """The questions to the owner; ``channel`` None is a worker alone (tests of its data plane), whose
    questions are answered 503."""

    def __init__(self, channel: Channel | None, multi_model: bool) -> None:
        self.channel = channel
        self.multi_model = multi_model
        self._tickets = itertools.count(1)  # with the worker's process id, names its turns on probation

    async def ask(self, message: Call[R], *, mme: bool = True, timeout: float | None = None) -> R:
        """The owner's answer to ``message``; 503 when the main process cannot be reached;
        :class:`asyncio.TimeoutError` after ``timeout`` seconds."""
        if mme and not self.multi_model:
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        if self.channel is None:
            raise NotReady("the endpoint's owner is not reachable")
        try:
            return await self.channel.call(message, timeout)
        except ChannelClosed:
            raise NotReady("the server's main process is not reachable (it is stopping or restarting)") from None

    # ----- the multi-model API ---------------------------------------------------------------------
    async def load(self, body: bytes, target_model: str | None) -> None:
        await self.ask(LoadModel(body.decode("latin-1"), target_model))

    async def unload(self, name: str, target_model: str | None) -> None:
        await self.ask(UnloadModel(name, target_model))

    async def list_models(self, token: str | None, limit: str | None) -> dict[str, Any]:
        return await self.ask(ListModels(token, limit))

    async def describe(self, name: str) -> dict[str, str]:
        return await self.ask(DescribeModel(name))

    async def out_of_memory(self, message: str, status: int, oom_kills: int | None) -> bool:
        """Whether a failed invoke was out of memory (decided once for all workers)."""
        return await self.ask(InvokeFailed(message, status, oom_kills))

    # ----- the sessions' table -----------------------------------------------------------------------
    async def open_session(self, triton_name: str) -> OpenedSession:
        return await self.ask(OpenSession(triton_name), mme=False)

    async def use_session(self, session: str, triton_name: str) -> UsedSession:
        return await self.ask(UseSession(session, triton_name), mme=False)

    async def close_session(self, session: str, triton_name: str = "", any_model: bool = False) -> None:
        await self.ask(CloseSession(session, triton_name, any_model=any_model), mme=False)

    async def session_answered(self, session: str, wait: bool) -> None:
        """The session's sequence was answered: as a call (``wait``: the owner must know before the
        caller's next request, which another worker may take), else as a notice."""
        if wait:
            await self.ask(SessionAnswered(session), mme=False)
        elif self.channel is not None:
            self.channel.notify(SessionAnswered(session))

    # ----- a request sent again after a Triton death ---------------------------------------------------
    @contextlib.asynccontextmanager
    async def probation(self, deadline: float) -> AsyncIterator[None]:
        """This worker's turn to send again a request that was in flight when Triton died, held while the
        block runs (one at a time on the endpoint: :mod:`smtriton.serve.owner.probation`). The turn goes
        back however the block ends, and also when the wait for it ends first: cancelled (the client
        left), or at ``deadline`` (a :func:`time.monotonic` reading), which is a 503. A worker alone
        needs no turn."""
        channel = self.channel
        if channel is None:
            yield
            return
        turn = Probation(os.getpid(), next(self._tickets))
        try:
            try:
                granted = await self.ask(turn, mme=False, timeout=max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                granted = False
            if not granted:
                raise NotReady(
                    "Triton serves again, but this request's turn to be sent again (one at a time after a "
                    "Triton death) did not come within its timeout"
                )
            yield
        finally:
            channel.notify(ProbationOver(turn.worker, turn.ticket))
