"""The Triton supervisor: one `tritonserver` child on loopback ports, kept alive.

It assembles the backend directory, starts Triton on free loopback ports (another port if one was
taken meanwhile), waits until it is live, and restarts it with back-off when it dies. What to do once
Triton is live (load the SME model, restore MME models) and while it lives (watch model health) comes
in as hooks at construction; the supervisor knows nothing about models or HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smtriton.serve.backoff import Backoff
from smtriton.serve.errors import NotReady, ServeError
from smtriton.serve.settings import Settings
from smtriton.serve.triton.access import TritonAccess
from smtriton.serve.triton.backends import assemble_backends
from smtriton.serve.triton.installation import TritonInstallation
from smtriton.serve.triton.ports import pick_port
from smtriton.serve.triton.process import Ports, TritonProcess, build_command
from smtriton.serve.triton.shm import given_prefix, new_prefix, remove_regions

if TYPE_CHECKING:  # imported when Triton has been spawned: start-up does not wait for them
    from smtriton.serve.triton.client import TritonClient

log = logging.getLogger("serve")

_BIND_FAILURE_MARKERS = ("failed to start", "Address already in use", "address already in use")
# Between failed starts, restarts and failed watches: the first wait, doubled each time up to the last.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A Triton (or a watch) that ran this long before failing failed anew: it starts from the shortest back-off.
STABLE_RUN_S = 60.0
BIND_ATTEMPTS = 5
# A watch that failed this soon before its Triton exited failed for that exit (reported on its own).
WATCH_EXIT_GRACE_S = 0.5


class TritonState(enum.Enum):
    STARTING = "starting"
    LIVE = "live"
    DOWN = "down"
    STOPPING = "stopping"


Hook = Callable[[], Coroutine[Any, Any, None]]


class TritonSupervisor:
    """Owns the Triton process and the clients that reach it.

    ``on_live`` runs each time Triton has (re)started and answers as live, before :attr:`live` turns
    true; ``watch`` runs while that Triton lives and is cancelled when it exits (one that fails is logged
    and run again after a back-off: Triton stays up, since the watch is not Triton); ``on_exit`` is called
    when Triton died on its own (not on shutdown); ``on_change`` whenever :attr:`state` or
    :attr:`ports` changed. ``load_models`` are loaded by Triton as it starts.
    """

    def __init__(
        self,
        settings: Settings,
        installation: TritonInstallation,
        repository: Path,
        work_dir: Path,
        *,
        on_live: Hook | None = None,
        watch: Hook | None = None,
        on_exit: Callable[[], None] | None = None,
        on_change: Callable[[], None] | None = None,
        metrics_wanted: bool = False,
        load_models: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.installation = installation
        self.repository = repository
        self._work_dir = work_dir
        self._on_live = on_live
        self._watch = watch
        self._on_exit = on_exit
        self._on_change = on_change
        self._metrics_wanted = metrics_wanted or settings.triton.allow_metrics
        self._load_models = tuple(load_models)
        self._state = TritonState.STARTING
        self._client: TritonClient | None = None
        self.ports: Ports | None = None  # those of the Triton running now (new ones after a restart)
        self.spawns = 0  # tritonserver processes started so far: which Triton is the one running now
        self.process: TritonProcess | None = None
        self._backend_dir: Path | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._spawned = asyncio.Event()
        # The Python backend's shared memory of each Triton started here carries this prefix, so what a
        # killed Triton leaves in /dev/shm is removed before the next starts (a prefix the deployment
        # set itself may be shared with others: left alone).
        self.shm_prefix = None if given_prefix(settings.triton.additional_args) else new_prefix()
        # Triton's APIs that load models, show configs and map shared memory answer this value only.
        self.access = TritonAccess.new()

    @property
    def state(self) -> TritonState:
        return self._state

    def _set_state(self, state: TritonState) -> None:
        self._state = state
        self._tell(self._on_change)

    @staticmethod
    def _tell(hook: Callable[[], None] | None) -> None:
        """Call a listener; one that fails is logged and never stops the supervision."""
        if hook is None:
            return
        try:
            hook()
        except Exception:
            log.exception("a listener of the Triton supervisor failed")

    @property
    def client(self) -> TritonClient | None:
        """The client of the Triton started last (it may be down: :meth:`running_client` checks)."""
        return self._client

    @property
    def live(self) -> bool:
        return self._state is TritonState.LIVE

    @property
    def running(self) -> bool:
        """A tritonserver process runs now (it may not answer yet)."""
        return self.process is not None and self.process.returncode is None

    @property
    def metrics_url(self) -> str | None:
        """Triton's own metrics endpoint (loopback), when it was asked for."""
        if self.ports is None or self.ports.metrics is None:
            return None
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def start(self) -> None:
        """Begin starting Triton in the background and return at once (again: nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="triton-supervisor")

    async def wait_spawned(self) -> None:
        """Until the first tritonserver process runs (or failed to start): from then on it boots on
        its own, and the front can spend the time on its imports."""
        await self._spawned.wait()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop Triton (drain, then kill its group, within ``timeout`` seconds: by default Triton's exit
        timeout and a margin) and close the clients; once."""
        if self._state is TritonState.STOPPING:
            return
        self._set_state(TritonState.STOPPING)
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            # First: Triton's HTTP shutdown waits for open connections, and our pool holds some.
            await self._client.close()
        if self.process is not None:
            await self.process.stop(timeout if timeout is not None else self.settings.triton_exit_timeout_s + 5)
        await self._remove_shared_memory()

    async def _remove_shared_memory(self) -> None:
        """Remove the shared memory of Tritons started here (none of them runs now)."""
        if self.shm_prefix is not None:
            await asyncio.to_thread(remove_regions, self.shm_prefix)

    def running_client(self) -> TritonClient:
        """The client while a Triton process runs (model loads need it before it is marked live)."""
        if self._state is TritonState.STOPPING or self._client is None or self.process is None:
            raise NotReady("Triton is not running")
        if self.process.returncode is not None:
            raise NotReady("Triton is restarting")
        return self._client

    async def _spawn(self) -> TritonProcess:
        """Start tritonserver on free loopback ports; another port if one was taken meanwhile."""
        if self._backend_dir is None:
            self._backend_dir = await asyncio.to_thread(
                assemble_backends, self.installation, self._work_dir / "backends"
            )
        opts = self.settings.triton
        port_range = self.settings.safe_port_range
        taken = {self.settings.port}
        for attempt in range(1, BIND_ATTEMPTS + 1):
            http = pick_port(port_range, taken)
            # gRPC on loopback always: decoupled models stream through it (HTTP /infer refuses them).
            grpc = opts.grpc_port or pick_port(port_range, taken | {http})
            metrics = opts.metrics_port or pick_port(port_range, taken | {http, grpc}) if self._metrics_wanted else None
            ports = Ports(http=http, grpc=grpc, metrics=metrics)
            command = build_command(
                self.installation,
                self.settings,
                self.repository,
                self._backend_dir,
                ports,
                self._load_models,
                self.shm_prefix,
                self.access,
            )
            await self._remove_shared_memory()  # what a Triton killed before left behind
            process = TritonProcess(command, self.installation.env, self.access)
            await process.spawn()
            self.spawns += 1
            self._spawned.set()
            await self._replace_client(ports)
            if await self._wait_live(process):
                return process
            code = await process.stop(5)
            if any(m in line for line in process.recent_lines for m in _BIND_FAILURE_MARKERS):
                log.warning("tritonserver could not bind port %d (attempt %d); trying another", http, attempt)
                taken.add(http)
                continue
            raise RuntimeError(f"tritonserver exited during start-up with status {code}")
        raise RuntimeError(f"tritonserver could not bind a loopback port after {BIND_ATTEMPTS} attempts")

    async def _replace_client(self, ports: Ports) -> None:
        from smtriton.serve.triton.client import TritonClient

        if self._client is not None:
            await self._client.close()
        url = f"http://127.0.0.1:{ports.http}"
        self._client = TritonClient(url, self.settings.request_timeout_s, access=self.access)
        self.ports = ports
        self._tell(self._on_change)

    async def _wait_live(self, process: TritonProcess) -> bool:
        assert self._client is not None
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if process.returncode is not None:
                return False
            if await self._client.server_live():
                return True
            await asyncio.sleep(0.1)
        return False

    async def _start(self) -> TritonProcess:
        """One start: a live tritonserver whose ``on_live`` hook ran through. Whatever fails on the way
        (the process, its port, the hook: Triton dying again while models are restored, say) stops the
        process started and raises: a failed start, retried with back-off."""
        self.process = process = await self._spawn()
        try:
            if self._on_live is not None:
                await self._until_exit(process, self._on_live())
        except Exception:
            await process.stop(5)
            raise
        return process

    @staticmethod
    async def _until_exit(process: TritonProcess, hook: Coroutine[Any, Any, None]) -> None:
        """Run ``hook`` unless tritonserver exits first: then it is cancelled and the start fails. (A
        call it made to a Triton killed meanwhile could otherwise wait for its whole timeout: the
        backend stubs Triton leaves behind keep the connection open until they are stopped.)"""
        running = asyncio.ensure_future(hook)
        exited = asyncio.ensure_future(process.exited())
        try:
            await asyncio.wait({running, exited}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the supervision itself is being cancelled
            running.cancel()
            exited.cancel()
            raise
        exited.cancel()
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running
            raise RuntimeError("tritonserver exited while it was starting")
        running.result()

    async def _keep_watching(self, watch: Hook, process: TritonProcess) -> None:
        """Run the ``watch`` hook while ``process`` lives: one that fails is logged (with its traceback
        the first time in a row, in one line after that) and run again after a back-off, so that a bug
        or an unexpected answer never silently ends model-health watching. Triton itself is left up: it
        still serves, and restarting it would unload every model for a fault of the watch. A watch that
        returns has finished its work; one that fails because Triton exited says nothing (the
        supervisor reports the exit, cancels this task, and watches the Triton it starts next)."""
        backoff = _backoff()
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await watch()
                return
            except Exception as exc:
                if await self._exits_within(process, WATCH_EXIT_GRACE_S):
                    return
                if backoff.after_run(time.monotonic() - started):
                    failures = 0
                failures += 1
                reason = _reason(exc)
                if failures == 1:
                    log.exception("the Triton watch failed: %s; restarting it in %g s", reason, backoff.delay)
                else:
                    log.error("the Triton watch failed again: %s; restarting it in %g s", reason, backoff.delay)
            await backoff.wait()

    @staticmethod
    async def _exits_within(process: TritonProcess, timeout: float) -> bool:
        """Whether tritonserver has exited or does within ``timeout`` (its return code is set a moment
        after it exits, and its sockets close a moment before: a watch can fail in between)."""
        exited = asyncio.ensure_future(process.exited())
        try:
            done, _ = await asyncio.wait({exited}, timeout=timeout)
        finally:
            exited.cancel()
        return bool(done)

    async def _supervise(self) -> None:
        """Start Triton, run the hooks, watch it; restart it with back-off when it dies."""
        backoff = _backoff()
        while not self._stopping.is_set():
            try:
                process = await self._start()
            except Exception as exc:  # a crash loop must end in a log line and a failing /ping
                self._spawned.set()
                self._set_state(TritonState.DOWN)
                log.error("tritonserver failed to start: %s; retrying in %g s", _reason(exc), backoff.delay)
                await backoff.wait()
                continue
            self._set_state(TritonState.LIVE)
            watcher = None
            if self._watch is not None:
                watcher = asyncio.create_task(self._keep_watching(self._watch, process), name="triton-watch")
            started = time.monotonic()
            try:
                code = await process.wait()
            finally:
                if watcher is not None:
                    watcher.cancel()
                    # Over before a restart starts another, or stop() returns (never held up by a hook).
                    await asyncio.wait({watcher}, timeout=5)
            if self._stopping.is_set():
                return
            self._set_state(TritonState.DOWN)
            self._tell(self._on_exit)
            backoff.after_run(time.monotonic() - started)
            log.error("tritonserver exited unexpectedly (status %s); restarting in %g s", code, backoff.delay)
            await process.stop(1)
            await backoff.wait()


def _backoff() -> Backoff:
    return Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S, stable_s=STABLE_RUN_S)


def _reason(exc: Exception) -> str:
    return exc.message if isinstance(exc, ServeError) else str(exc) or exc.__class__.__name__
