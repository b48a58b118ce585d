"""The main process assembled: Triton's supervisor, the front workers and the endpoint's owner, started
in that order and stopped within one budget.

Triton starts first, then the workers, and the endpoint's owner is assembled while both boot: the
workers' imports (FastAPI, uvicorn, aiohttp: about half a second) overlap Triton's own start-up
instead of preceding it. The supervisor is built before the endpoint it reports to, so its hooks are
this class's methods, which pass each event on once the endpoint exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from smtriton.serve import eventloop
from smtriton.serve.errors import StartupError
from smtriton.serve.host import cgroups
from smtriton.serve.http.sockets import reserve_port
from smtriton.serve.owner.reaper import become_subreaper, reap_forever, reap_the_last
from smtriton.serve.settings import Settings
from smtriton.serve.triton.installation import TritonInstallation

if TYPE_CHECKING:
    from smtriton.serve.owner.endpoint import Endpoint
    from smtriton.serve.owner.pool import WorkerPool
    from smtriton.serve.triton.supervisor import TritonSupervisor

log = logging.getLogger("serve")


def run(
    settings: Settings,
    installation: TritonInstallation,
    default: str | None,
    loads: list[str],
    work: Path,
    worker: str,
) -> None:
    """Hold the port, then serve until SIGTERM (``work`` is scratch space, ``worker`` what each front
    worker runs). Raises StartupError when the endpoint cannot serve at all."""
    port = reserve_port(settings.host, settings.port)  # at once: a port that is taken stops serve here
    try:
        eventloop.run(MainProcess(settings, installation, default, loads, work, worker).serve())
    finally:
        port.close()


class MainProcess:
    """`serve`'s main process: the SME model ``default`` (with ``loads``), or an MME when it is None."""

    def __init__(
        self,
        settings: Settings,
        installation: TritonInstallation,
        default: str | None,
        loads: list[str],
        work: Path,
        worker: str,
    ) -> None:
        self.settings = settings
        self.installation = installation
        self.default = default
        self.loads = loads
        self.work = work
        self.worker = worker
        self.endpoint: Endpoint | None = None
        self._assembled = asyncio.Event()
        self._stop = asyncio.Event()
        self._fatal: list[str] = []

    async def serve(self) -> None:
        """Start everything, serve until SIGTERM or SIGINT, then drain and stop."""
        settings, work = self.settings, self.work
        become_subreaper()  # before any child: whatever its descendants orphan comes here
        if settings.metrics_port is not None:
            from smtriton.serve.metrics import share_between_processes

            share_between_processes(work / "metrics")  # before prometheus_client is imported, here or in a worker
        from smtriton.serve.owner.pool import WorkerPool
        from smtriton.serve.triton.supervisor import TritonSupervisor

        log.info("limits: %s", cgroups.describe(cgroups.memory_group(), cgroups.cpu_group()))
        if self.default is None:
            repository = work / "managed"  # MME: the repository serve manages (docs/design.md §3)
            repository.mkdir()
        else:
            repository = settings.model_repository.resolve()
        supervisor = TritonSupervisor(
            settings,
            self.installation,
            repository,
            work,
            on_live=self._on_triton_live,
            watch=self._watch_model_health if self.default is not None else None,
            on_exit=self._on_triton_exit,
            on_change=self._on_change,
            metrics_wanted=settings.metrics_port is not None,
            load_models=self.loads,
        )
        workers = WorkerPool(
            settings.workers,
            entry=self.worker,
            heartbeat_timeout=settings.worker_heartbeat_timeout_s,
            on_exit=self._on_worker_exit,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        reaper = asyncio.create_task(reap_forever(), name="reaper")
        try:
            supervisor.start()
            await supervisor.wait_spawned()
            workers.start()
            endpoint = self._assemble(supervisor, workers)
            await self._stop.wait()
            log.info("stopping: draining every worker, then Triton")
            endpoint.begin_drain()
        finally:
            await _stop(settings, workers, supervisor)  # also when start-up failed half-way
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await reap_the_last()  # what Triton's stop left
        if self._fatal:
            raise StartupError(self._fatal[0])

    def _assemble(self, supervisor: TritonSupervisor, workers: WorkerPool) -> Endpoint:
        """The endpoint's owner, given to the workers (and the supervisor's hooks) once assembled."""
        from smtriton.serve.metrics import Metrics
        from smtriton.serve.multimodel.registry import ModelRegistry
        from smtriton.serve.owner.endpoint import Endpoint

        settings = self.settings
        metrics = Metrics(enabled=settings.metrics_port is not None)
        registry = None
        where = f"on {settings.host}:{settings.port} ({settings.workers} front worker{'s' * (settings.workers > 1)})"
        if self.default is None:
            log.info("multi-model endpoint: models from %s, %s", settings.model_root, where)
            registry = ModelRegistry(
                settings,
                supervisor.repository,
                supervisor.running_client,
                native_backends=self.installation.native_backends(),
            )
        else:
            log.info(
                "starting: model %s from %s %s; it answers once loaded", self.default, settings.model_repository, where
            )
        endpoint = Endpoint(settings, supervisor, metrics, workers, self.default, registry, self._on_fatal, self.loads)
        self.endpoint = endpoint
        workers.open(endpoint.hello, endpoint.handle)
        self._assembled.set()
        if settings.metrics_port is not None:
            metrics.serve(settings.metrics_host, settings.metrics_port, lambda: supervisor.metrics_url)
        return endpoint

    def _on_fatal(self, why: str) -> None:
        """The endpoint cannot serve at all: stop, and exit saying why."""
        self._fatal.append(why)
        self._stop.set()

    # ----- the supervisor's hooks, passed on to the endpoint -----------------------------------------
    async def _on_triton_live(self) -> None:
        await self._assembled.wait()  # Triton may be live before the endpoint is assembled
        assert self.endpoint is not None
        await self.endpoint.on_triton_live()

    async def _watch_model_health(self) -> None:
        assert self.endpoint is not None  # called once on_live returned
        await self.endpoint.watch_model_health()

    def _on_triton_exit(self) -> None:
        if self.endpoint is not None:
            self.endpoint.on_triton_exit()

    def _on_change(self) -> None:
        if self.endpoint is not None:
            self.endpoint.publish()

    def _on_worker_exit(self, pid: int) -> None:
        """A worker exited on its own: its live gauges stop counting, and what it held of the endpoint goes back."""
        _forget_worker_metrics(pid)
        if self.endpoint is not None:
            self.endpoint.worker_exited(pid)


async def _stop(settings: Settings, workers: WorkerPool, supervisor: TritonSupervisor) -> None:
    """Stop within one budget: the workers drain their share, Triton exits in what is left; Triton is
    stopped whatever happened to the workers."""
    budget = settings.stop_budget()
    deadline = time.monotonic() + settings.shutdown_timeout_s
    try:
        await workers.stop(budget.drain_s)
    finally:
        await supervisor.stop(max(budget.triton_s, deadline - time.monotonic()))


def _forget_worker_metrics(pid: int) -> None:
    """A worker exited: its live gauges stop counting (only where metrics are shared between processes)."""
    from smtriton.serve.metrics import Metrics

    Metrics.forget_process(pid)
