"""The endpoint's one owner, in `serve`'s main process: what every front worker must agree on.

Triton's life (through the supervisor), the served model's health, the drain on SIGTERM and the
multi-model table (through the registry) are decided here, once, whichever worker a request reached
(docs/design.md §4). Workers hold a copy of what they need on the hot path — Triton's loopback ports,
whether requests may go to Triton, what `/ping` answers, the multi-model records — which this owner
sends them on every change, and ask it for the rest (load, unload, list, describe, out-of-memory
verdicts). A model is announced to every worker before its load is answered, and an unload first has
every worker stop taking new invokes of it and finish those it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from smtriton.serve import sessions
from smtriton.serve.channel import EndpointState, Message
from smtriton.serve.errors import BadRequest, ModelLoadFailed, ModelNotFound, ServeError
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel import ModelRegistry, load_failure
from smtriton.serve.records import ModelRecord
from smtriton.serve.settings import Settings
from smtriton.serve.supervisor import TritonState, TritonSupervisor
from smtriton.serve.workers import WorkerPool

log = logging.getLogger("serve")

HEALTH_INTERVAL_S = 1.0
ANNOUNCE_TIMEOUT_S = 10.0  # a worker that takes longer to record a new model is passed over (logged)


class Endpoint:
    """The SME ``default_model``, or the MME ``registry``, on one supervised Triton, for ``workers``."""

    def __init__(
        self,
        settings: Settings,
        supervisor: TritonSupervisor,
        metrics: Metrics,
        workers: WorkerPool,
        default_model: str | None = None,
        registry: ModelRegistry | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        """``on_fatal`` is told why the endpoint cannot serve at all (the SME model failed to load)."""
        self.settings = settings
        self.supervisor = supervisor
        self.metrics = metrics
        self.workers = workers
        self.default_model = default_model
        self.registry = registry
        self.decoupled = False  # SME: the default model streams (decoupled transaction policy)
        self.model_ready = False  # SME: the default model is READY; MME: the registry is restored
        self.model_failed = False  # SME: the default model failed to load (or is no longer ready)
        self.draining = False
        self._published: EndpointState | None = None
        self._on_fatal = on_fatal
        self.sessions = sessions.SessionTable(settings.session_ttl_s)
        self._sequence_idle_s: dict[str, float] = {}  # a sequence model's idle timeout, once read
        if registry is not None:
            registry.listener = self

    # ----- what workers see -------------------------------------------------------------------------
    def state(self) -> EndpointState:
        supervisor = self.supervisor
        live = supervisor.live
        serving = live and self.model_ready  # draining too: accepted requests are still served
        if self.draining:
            healthy = False
        elif self.settings.ping_mode == "live":
            healthy = live and (self.model_ready or self.model_failed)
        else:
            healthy = live and self.model_ready
        ports = supervisor.ports
        return EndpointState(
            healthy=healthy,
            serving=serving,
            reason="" if serving else self._not_ready_message(),
            http_port=ports.http if ports is not None else None,
            grpc_port=ports.grpc if ports is not None else None,
            decoupled=self.decoupled,
        )

    def _not_ready_message(self) -> str:
        state = self.supervisor.state
        if state is TritonState.STOPPING or self.draining:
            return "server is shutting down"
        if self.default_model is None:
            return "Triton is restarting" if state is not TritonState.LIVE else "models are being restored"
        if self.model_failed:
            return f"model '{self.default_model}' is not ready"
        triton = "starting" if state is TritonState.LIVE else state.value
        return f"model '{self.default_model}' is not ready yet (Triton is {triton})"

    def publish(self) -> None:
        """Tell every worker the state, if it changed since it was last told."""
        state = self.state()
        if state != self._published:
            self._published = state
            self.workers.notify_all("state", state=state.to_wire())

    def hello(self, index: int) -> Message:
        """The first message a worker gets: who it is, the settings, the state and the models."""
        models = self.registry.announced() if self.registry is not None else ()
        return {
            "index": index,
            "settings": self.settings.model_dump(mode="json"),
            "default_model": self.default_model,
            "state": self.state().to_wire(),
            "models": [record.to_wire() for record in models],
        }

    def begin_drain(self) -> None:
        """SIGTERM arrived: /ping fails on every worker from now on; accepted requests still finish."""
        self.draining = True
        self.publish()

    # ----- the supervisor's hooks --------------------------------------------------------------------
    async def on_triton_live(self) -> None:
        """Triton (re)started: load the SME model, or restore the MME models, before /ping turns 200."""
        self.model_ready = self.model_failed = False
        self.publish()
        self._forget_sequences()
        if self.default_model is None:
            if self.registry is not None:
                await self.registry.restore()
            self.model_ready = True
            return
        client = self.supervisor.running_client()
        model = self.default_model
        # Triton loaded the model as it started (the supervisor's load_models); ask how that went, and
        # load it here only if Triton does not list it (then the load's own error says why).
        state, reason = await client.model_state(model)
        try:
            if state != "READY" and (state is None or not reason):
                await client.load_model(model, self.settings.startup_timeout_s)
            elif state != "READY":
                raise ModelLoadFailed(reason)
        except ServeError as exc:
            self.model_failed = True
            why = load_failure(model, exc.message, {})
            log.error("%s; Triton said: %s", why, exc.message)
            if self._on_fatal is not None:  # as NVIDIA's server does: SageMaker learns at once, not at its timeout
                self._on_fatal(why)
            return
        self.decoupled = await client.is_decoupled(model)
        self.model_ready = True
        log.info("model %s is ready", model)

    async def watch_model_health(self) -> None:
        """Keep /ping true to Triton's view of the SME model (it may be unloaded or fail later)."""
        model = self.default_model
        if model is None:
            return
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            client = self.supervisor.client
            if client is None or not self.supervisor.live:
                continue
            ready = await client.model_ready(model)
            if not self.supervisor.running:
                return
            if ready is not None and ready != self.model_ready:
                self.model_ready, self.model_failed = ready, not ready
                log.warning("model %s is %s", model, "ready" if ready else "no longer ready")
                self.publish()

    def on_triton_exit(self) -> None:
        self.metrics.triton_restarts.inc()

    # ----- what workers ask -------------------------------------------------------------------------
    async def handle(self, op: str, message: Message) -> Any:
        """A worker's call (the multi-model API and the stateful sessions, decided here once)."""
        if op.startswith("session_"):
            return await self._session(op, message)
        registry = self.registry
        if registry is None:
            if op == "describe" or op == "unload":
                raise ModelNotFound(str(message.get("name")))
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        if op == "load":
            await registry.load(str(message["body"]).encode("latin-1"), message.get("target"))
            return None
        if op == "unload":
            await registry.unload(str(message["name"]), message.get("target"))
            return None
        if op == "list":
            return registry.list(message.get("token"), message.get("limit"))
        if op == "describe":
            return registry.describe(str(message["name"]))
        if op == "invoke_oom":
            return registry.invoke_oom(str(message["message"]))
        raise BadRequest(f"unknown operation {op!r}")

    async def _session(self, op: str, message: Message) -> Any:
        table, now = self.sessions, time.time()
        if op == "session_open":
            model = str(message["model"])
            session = table.open(model, await self._idle_s(model), now)
            expires = sessions.expires_text(session.expires_at)
            return {"id": session.id, "sequence_id": session.sequence_id, "expires": expires}
        if op == "session_use":
            session = table.use(str(message["session"]), str(message["model"]), now)
            return {"sequence_id": session.sequence_id, "start": not session.started}
        if op == "session_close":
            if not message.get("any_model"):  # the caller's close: 400 unless open for this model
                table.get(str(message["session"]), str(message["model"]), now)
            table.forget(str(message["session"]))
            return None
        if op == "session_answered":  # the model answered a request of the session (a call for its first)
            table.answered(str(message["session"]))
            return None
        raise BadRequest(f"unknown operation {op!r}")

    async def _idle_s(self, model: str) -> float:
        """How long Triton keeps an idle sequence of ``model`` (400 for a model that keeps none)."""
        idle = self._sequence_idle_s.get(model)
        if idle is None:
            config = await self.supervisor.running_client().model_config(model)
            batching = config.get("sequence_batching")
            if not isinstance(batching, dict):
                raise BadRequest(
                    f"model '{model}' keeps no state between requests (its config has no sequence_batching): "
                    "a stateful session needs a sequence model"
                )
            microseconds = int(str(batching.get("max_sequence_idle_microseconds") or 0))
            idle = microseconds / 1e6 if microseconds > 0 else sessions.TRITON_IDLE_S
            self._sequence_idle_s[model] = idle
        return idle

    def _forget_sequences(self, model: str | None = None) -> None:
        """Triton restarted (every sequence's state is gone), or ``model`` was unloaded."""
        if model is None:
            self.sessions.clear()
            self._sequence_idle_s.clear()
        else:
            self.sessions.drop_model(model)
            self._sequence_idle_s.pop(model, None)

    # ----- the registry's listener: every worker sees a change before it is answered -----------------
    async def added(self, record: ModelRecord) -> None:
        await self.workers.call_all("model_added", ANNOUNCE_TIMEOUT_S, record=record.to_wire())

    async def draining_model(self, name: str, timeout: float) -> None:
        record = self.registry.records.get(name) if self.registry is not None else None
        if record is not None:  # unloading a model ends its sessions
            self._forget_sequences(record.triton_name)
        await self.workers.call_all("model_draining", timeout + ANNOUNCE_TIMEOUT_S, name=name, seconds=timeout)

    async def removed(self, name: str) -> None:
        await self.workers.call_all("model_removed", ANNOUNCE_TIMEOUT_S, name=name)
