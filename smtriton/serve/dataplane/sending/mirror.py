"""What a front worker knows of the endpoint: the owner's state and the multi-model records, as the
endpoint's owner in the main process told it (docs/design.md §3a), and the invokes it runs now.

The owner sends the state (Triton's ports, whether requests may go to Triton, what ``/ping`` answers)
whenever it changes, and each change of the model table before anyone is answered; this copy is what
the hot path reads, so that no request crosses processes on its way to Triton.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from smtriton.serve.errors import ModelNotFound
from smtriton.serve.host import cgroups
from smtriton.serve.ipc.messages import STARTING, EndpointState
from smtriton.serve.multimodel.records import ModelRecord

log = logging.getLogger("serve")


class Invocable:
    """A loaded model as this worker invokes it: its record and the invokes running now."""

    def __init__(self, record: ModelRecord) -> None:
        self.record = record
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()


class Invoke:
    """One MME invoke in flight: the model, and the OOM killer's count when it began (so a failure can
    be judged by what happened during this request only). :meth:`end` once, however it ends."""

    __slots__ = ("_ended", "model", "oom_kills")

    def __init__(self, model: Invocable, oom_kills: int | None) -> None:
        self.model = model
        self.oom_kills = oom_kills
        self._ended = False
        model.inflight += 1
        model.idle.clear()

    @property
    def record(self) -> ModelRecord:
        return self.model.record

    def end(self) -> None:
        """The invoke is no longer in flight (an unload waiting for it may go on); only the first call counts."""
        if self._ended:
            return
        self._ended = True
        model = self.model
        model.inflight -= 1
        if model.inflight == 0:
            model.idle.set()


@dataclass(slots=True)
class Target:
    """The Triton model a request goes to; ``invoke``: an MME invoke in flight (None on an SME)."""

    triton_name: str
    decoupled: bool
    invoke: Invoke | None = None


async def _wait_idle(name: str, model: Invocable, timeout: float) -> None:
    try:
        await asyncio.wait_for(model.idle.wait(), timeout)
    except asyncio.TimeoutError:
        log.warning("unloading %s with %d requests still in flight", name, model.inflight)


class EndpointMirror:
    """The owner's state and records in one worker (``multi_model``: the endpoint is an MME)."""

    def __init__(self, multi_model: bool) -> None:
        self.state = STARTING
        self.draining = False
        self.changed = asyncio.Event()  # set (and replaced) each time the state changes: what waiters wait on
        self.models: dict[str, Invocable] = {}
        # The OOM killer's count in this cgroup, read as each MME invoke begins (None: not counted here).
        self._oom = cgroups.oom_counter(cgroups.memory_group()) if multi_model else None

    def close(self) -> None:
        if self._oom is not None:
            self._oom.close()

    @property
    def healthy(self) -> bool:
        """What /ping answers, as the owner decided it (false at once on this worker's SIGTERM)."""
        return self.state.healthy and not self.draining

    # ----- the model table ---------------------------------------------------------------------------
    def add(self, record: ModelRecord) -> None:
        self.models[record.model_name] = Invocable(record)

    def forget(self, name: str) -> Invocable | None:
        return self.models.pop(name, None)

    def drain(self, name: str, timeout: float) -> Awaitable[None] | None:
        """An unload: new invokes of ``name`` get 404 from now on; the invokes running finish in what is
        returned (up to ``timeout`` seconds)."""
        model = self.forget(name)
        return _wait_idle(name, model, timeout) if model is not None else None

    def begin_invoke(self, name: str, target_model: str | None) -> Invoke:
        """An MME model resolved for one invocation, counted in flight until :meth:`Invoke.end` (an
        unload waits for it)."""
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(name)
        model.record.check_target(target_model)
        return Invoke(model, self._oom.read() if self._oom is not None else None)

    def apply(self, state: EndpointState) -> EndpointState:
        """Take the owner's new state (those waiting for a change are woken); the one it replaces is
        returned."""
        old, self.state = self.state, state
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        return old
