"""What a front worker asks of the endpoint's owner in the main process, over the worker's channel.

Everything the workers must agree on is decided there (docs/design.md §3a): the multi-model API (load,
unload, list, describe), the sessions' table and the out-of-memory verdict on a failed invoke. Each
question is a typed message (:mod:`smtriton.serve.ipc.messages`); a channel that is gone is a 503.
"""

from __future__ import annotations

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

    async def ask(self, message: Call[R], *, mme: bool = True) -> R:
        """The owner's answer to ``message``; 503 when the main process cannot be reached."""
        if mme and not self.multi_model:
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        if self.channel is None:
            raise NotReady("the endpoint's owner is not reachable")
        try:
            return await self.channel.call(message)
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
    async def probation(self) -> int | None:
        """Wait for this worker's turn to send a request that was in flight when Triton died (one at a
        time on the endpoint: :mod:`smtriton.serve.owner.probation`); None for a worker alone."""
        if self.channel is None:
            return None
        return await self.ask(Probation(), mme=False)

    def probation_over(self, token: int | None) -> None:
        if token is not None and self.channel is not None:
            self.channel.notify(ProbationOver(token))
