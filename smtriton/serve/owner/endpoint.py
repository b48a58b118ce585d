"""The endpoint's owner, in `serve`'s main process: what every front worker must agree on.

Each job has one owner here (docs/design.md §3a): :class:`Health` decides what `/ping` answers and
whether requests may go to Triton (the SME model's readiness, Triton's life, the drain) and sends it to
every worker; :class:`Announcer` tells every worker each change of the multi-model table before the
registry answers anyone; the registry (:mod:`smtriton.serve.multimodel.registry`) keeps the table; the session
keeper (:mod:`smtriton.serve.owner.sessions`) the stateful sessions. :class:`Endpoint` assembles them, runs
the supervisor's hooks, and answers what a worker asks through the part that owns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from smtriton.serve.errors import BadRequest, ModelLoadFailed, ModelNotFound, ServeError
from smtriton.serve.ipc.messages import (
    CloseSession,
    DescribeModel,
    EndpointState,
    Hello,
    InvokeFailed,
    ListModels,
    LoadModel,
    Message,
    ModelAdded,
    ModelDraining,
    ModelRemoved,
    OpenSession,
    Probation,
    ProbationOver,
    SessionAnswered,
    StateChanged,
    UnloadModel,
    UseSession,
)
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.multimodel.registry import ModelRegistry
from smtriton.serve.multimodel.staging import load_failure
from smtriton.serve.owner.pool import WorkerPool
from smtriton.serve.owner.probation import ProbationDesk
from smtriton.serve.owner.sessions import SessionKeeper
from smtriton.serve.settings import Settings
from smtriton.serve.triton.supervisor import TritonState, TritonSupervisor

log = logging.getLogger("serve")

HEALTH_INTERVAL_S = 1.0
ANNOUNCE_TIMEOUT_S = 10.0  # a worker that takes longer to record a new model is passed over (logged)


class Health:
    """What `/ping` answers and whether requests may go to Triton, decided once for every worker: the
    SME model's readiness (or, in an MME, the restore), Triton's state and the drain."""

    def __init__(
        self,
        settings: Settings,
        supervisor: TritonSupervisor,
        workers: WorkerPool,
        default_model: str | None,
        on_fatal: Callable[[str], None] | None = None,
        loads: Sequence[str] = (),
    ) -> None:
        """``on_fatal`` is told why the endpoint cannot serve at all (a model of an SME failed to load);
        ``loads`` are the models an SME loads (those its default model calls, and the default one)."""
        self.settings = settings
        self.supervisor = supervisor
        self.workers = workers
        self.default_model = default_model
        self.loads = list(loads) or ([default_model] if default_model is not None else [])
        self.decoupled = False  # SME: the default model streams (decoupled transaction policy)
        self.model_ready = False  # SME: the default model is READY; MME: the registry is restored
        self.model_failed = False  # SME: the default model failed to load (or is no longer ready)
        self.draining = False
        self.served = False  # a Triton has served on this endpoint: after its death requests wait for the next
        self._published: EndpointState | None = None
        self._on_fatal = on_fatal

    def state(self) -> EndpointState:
        supervisor = self.supervisor
        live = supervisor.live
        serving = live and self.model_ready  # draining too: accepted requests are still served
        self.served = self.served or serving
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
            generation=supervisor.spawns,
            returning=not serving
            and self.served
            and not (self.model_failed or self.draining or supervisor.state is TritonState.STOPPING),
            triton_key=supervisor.access.key,
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
            self.workers.notify_all(StateChanged(state))

    def begin_drain(self) -> None:
        """SIGTERM arrived: /ping fails on every worker from now on; accepted requests still finish."""
        self.draining = True
        self.publish()

    def triton_started(self) -> None:
        """A new Triton is live: nothing is ready on it until the models are (re)loaded."""
        self.model_ready = self.model_failed = False
        self.publish()

    def ready(self) -> None:
        self.model_ready = True

    async def load_default_model(self) -> None:
        """The SME's models on a Triton that just started, the default one last: ready, or failed
        (``on_fatal`` told why: /ping is 200 only once every one of them is ready)."""
        model = self.default_model
        assert model is not None
        client = self.supervisor.running_client()
        for name in self.loads:
            # Triton loaded the models as it started (the supervisor's load_models); ask how that went, and
            # load one here only if Triton does not list it (then the load's own error says why).
            state, reason = await client.model_state(name)
            try:
                if state != "READY" and (state is None or not reason):
                    await client.load_model(name, self.settings.startup_timeout_s)
                elif state != "READY":
                    raise ModelLoadFailed(reason)
            except ServeError as exc:
                self.model_failed = True
                why = load_failure(name, exc.message)
                log.error("%s; Triton said: %s", why, exc.message)
                if self._on_fatal is not None:  # as NVIDIA's server does: SageMaker learns at once, not at its timeout
                    self._on_fatal(why)
                return
        self.decoupled = await client.is_decoupled(model)
        self.model_ready = True
        others = [name for name in self.loads if name != model]
        log.info("model %s is ready%s", model, f" (with {', '.join(others)})" if others else "")

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


class Announcer:
    """What every worker has been told of the multi-model table (:attr:`models`), and the registry's
    listener: each change reaches every worker before the registry answers anyone.

    :attr:`models` changes before the workers are told, and a worker's first message (hello) is built
    from it: a worker that starts while a change is being told either gets the change in its hello or
    is among the workers told, never neither."""

    def __init__(self, workers: WorkerPool, on_model_gone: Callable[[str], None]) -> None:
        """``on_model_gone`` is told the Triton name of each model that is (re)added or leaves: what was
        kept about a model of that name (its sessions) no longer holds."""
        self.workers = workers
        self.models: dict[str, ModelRecord] = {}
        self._gone = on_model_gone

    async def added(self, record: ModelRecord) -> None:
        self._gone(record.triton_name)
        self.models[record.model_name] = record
        await self.workers.call_all(ModelAdded(record), ANNOUNCE_TIMEOUT_S)

    async def draining_model(self, record: ModelRecord, timeout: float) -> None:
        """Every worker stops taking invokes of the model and finishes those it runs (up to ``timeout``)."""
        self._gone(record.triton_name)
        self.models.pop(record.model_name, None)
        await self.workers.call_all(ModelDraining(record.model_name, timeout), timeout + ANNOUNCE_TIMEOUT_S)

    async def removed(self, record: ModelRecord) -> None:
        """The model left the table: dropped by a restore, or its load failed while being announced
        (taken back from the workers that had recorded it, and from the hellos)."""
        self._gone(record.triton_name)
        self.models.pop(record.model_name, None)
        await self.workers.call_all(ModelRemoved(record.model_name), ANNOUNCE_TIMEOUT_S)


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
        loads: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.supervisor = supervisor
        self.metrics = metrics
        self.default_model = default_model
        self.registry = registry
        self.health = Health(settings, supervisor, workers, default_model, on_fatal, loads)
        self.sessions = SessionKeeper(settings.session_ttl_s, supervisor.running_client)
        # requests sent again after a Triton death, one at a time
        self.probation = ProbationDesk(settings.probation_lease_s)
        self.announcer = Announcer(workers, self.sessions.forget_model)
        if registry is not None:
            registry.listener = self.announcer

    def hello(self, index: int) -> Hello:
        """The first message a worker gets: who it is, the settings, the state and the models."""
        return Hello(
            index=index,
            settings=self.settings.model_dump(mode="json"),
            default_model=self.default_model,
            state=self.health.state(),
            models=tuple(self.announcer.models.values()),
        )

    def publish(self) -> None:
        self.health.publish()

    def begin_drain(self) -> None:
        self.health.begin_drain()

    # ----- the supervisor's hooks --------------------------------------------------------------------
    async def on_triton_live(self) -> None:
        """Triton (re)started: load the SME model, or restore the MME models, before /ping turns 200."""
        self.health.triton_started()
        self.sessions.clear()  # every sequence's state went with the old Triton
        if self.registry is not None:
            await self.registry.restore()
            self.health.ready()
        elif self.default_model is not None:
            await self.health.load_default_model()

    async def watch_model_health(self) -> None:
        await self.health.watch_model_health()

    def on_triton_exit(self) -> None:
        self.metrics.triton_restarts.inc()

    def worker_exited(self, pid: int) -> None:
        """A front worker died: what it held here goes back (its turns on probation, waiting or running)."""
        self.probation.forget(pid)

    # ----- what workers ask -------------------------------------------------------------------------
    def handle(self, message: Message) -> Any:
        """A worker's call, answered by the part that owns it (the probation desk, the sessions, the
        multi-model table). A turn on probation is put in line before this returns, so that the notice
        giving it back, which may come right behind, finds it; the rest is answered by what is returned."""
        match message:
            case Probation(worker=worker, ticket=ticket):
                return self.probation.grant((worker, ticket))
            case ProbationOver(worker=worker, ticket=ticket):
                return self.probation.release((worker, ticket))
        return self._answer(message)

    async def _answer(self, message: Message) -> Any:
        sessions = self.sessions
        match message:
            case OpenSession(model=model):
                return await sessions.open(model)
            case UseSession(session=session, model=model):
                return sessions.use(session, model)
            case CloseSession(session=session, model=model, any_model=any_model):
                return sessions.close(session, model, any_model)
            case SessionAnswered(session=session):
                return sessions.answered(session)
        registry = self.registry
        if registry is None:
            if isinstance(message, DescribeModel | UnloadModel):
                raise ModelNotFound(message.name)
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        match message:
            case LoadModel(body=body, target=target):
                return await registry.load(body.encode("latin-1"), target)
            case UnloadModel(name=name, target=target):
                return await registry.unload(name, target)
            case ListModels(token=token, limit=limit):
                return registry.list(token, limit)
            case DescribeModel(name=name):
                return registry.describe(name)
            case InvokeFailed(message=text, status=status, oom_kills=kills):
                return registry.invoke_out_of_memory(text, status, kills)
        raise BadRequest(f"unknown operation {message.op!r}")
