"""The serving engine: owns Triton's lifecycle and answers the data plane for the routes.

It starts Triton in the background (the SageMaker port is bound at once; /ping says 503 until the
model is READY), loads the SME default model, watches the process, restarts it with back-off if it
dies, and stops it on shutdown. /ping reads a flag kept here, never blocking on Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from smtriton.serve import codec, transcode
from smtriton.serve.errors import BadRequest, NotReady, ServeError, error_body
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from smtriton.serve.streaming import StreamClient
from smtriton.serve.triton.backends import assemble_backends
from smtriton.serve.triton.client import TritonClient, UpstreamResponse, error_text
from smtriton.serve.triton.installation import TritonInstallation
from smtriton.serve.triton.ports import pick_port
from smtriton.serve.triton.process import Ports, TritonProcess, build_command

log = logging.getLogger("serve")

# Triton answers 500 for request-parsing failures; they are client errors (CONTRACT.md §2.6, B11).
_PARSE_ERROR_PREFIXES = (b'{"error":"failed to parse the request JSON buffer', b'{"error":"Unable to parse')
_BIND_FAILURE_MARKERS = ("failed to start", "Address already in use", "address already in use")
HEALTH_INTERVAL_S = 1.0
# CONTRACT.md §7: the custom attributes header travels to the model as this request parameter, and a
# response parameter of the same name set by the model comes back as the header.
CUSTOM_ATTRIBUTES = "sagemaker_custom_attributes"
MAX_BACKOFF_S = 30.0


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    MODEL_FAILED = "model_failed"
    TRITON_DOWN = "triton_down"
    STOPPING = "stopping"


class Engine:
    """One Triton child and its health: SME serves ``default_model``; MME (no default) its registry."""

    def __init__(
        self,
        settings: Settings,
        installation: TritonInstallation,
        default_model: str | None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics(enabled=False)
        self.triton_metrics_url: str | None = None
        self.installation = installation
        self.default_model = default_model
        # MME: called once Triton is (again) live, before /ping turns 200 — restores loaded models.
        self.on_triton_ready: Callable[[], Awaitable[None]] | None = None
        self.state = State.STARTING
        self.client: TritonClient | None = None
        self.stream_client: StreamClient | None = None
        self.decoupled = False  # SME: the default model streams (decoupled transaction policy)
        self.process: TritonProcess | None = None
        self.draining = False
        if settings.work_dir is not None:
            settings.work_dir.mkdir(parents=True, exist_ok=True)
        self._workdir = Path(tempfile.mkdtemp(prefix="smtriton-", dir=settings.work_dir))
        if default_model is None:
            self.repository = self._workdir / "managed"  # MME: the managed repository (DESIGN.md §3)
            self.repository.mkdir()
        else:
            self.repository = settings.model_repository.resolve()
        self._backend_dir: Path | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # ----- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Begin starting Triton in the background and return at once."""
        self._supervisor = asyncio.create_task(self._supervise(), name="triton-supervisor")

    async def stop(self) -> None:
        """Stop Triton (drain, then kill its group) and release everything."""
        self.state = State.STOPPING
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self.client is not None:
            # First: Triton's HTTP shutdown waits for open connections, and our pool holds some.
            await self.client.close()
        if self.stream_client is not None:
            await self.stream_client.close()
        if self.process is not None:
            await self.process.stop(self.settings.triton_exit_timeout_s + 5)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def begin_drain(self) -> None:
        """SIGTERM arrived: /ping fails from now on so no new traffic is routed here; requests
        already accepted still run to completion before Triton is stopped."""
        self.draining = True

    @property
    def healthy(self) -> bool:
        """What /ping answers: Triton live and the default model READY (or live only, in live mode)."""
        if self.draining:
            return False
        if self.settings.ping_mode == "live":
            return self.state in (State.READY, State.MODEL_FAILED)
        return self.state is State.READY

    async def _spawn(self) -> TritonProcess:
        """Start tritonserver on free loopback ports; another port if one was taken meanwhile."""
        if self._backend_dir is None:
            self._backend_dir = await asyncio.to_thread(
                assemble_backends, self.installation, self._workdir / "backends"
            )
        opts = self.settings.triton
        taken = {self.settings.port}
        for attempt in range(1, 6):
            http = pick_port(self.settings.safe_port_range, taken)
            # gRPC on loopback always: decoupled models stream through it (HTTP /infer refuses them).
            grpc = opts.grpc_port or pick_port(self.settings.safe_port_range, taken | {http})
            # Triton's metrics (loopback only) are on when asked for, or when ours re-export them.
            metrics = (
                opts.metrics_port or pick_port(self.settings.safe_port_range, taken | {http, grpc or 0})
                if opts.allow_metrics or self.metrics.enabled
                else None
            )
            self.triton_metrics_url = f"http://127.0.0.1:{metrics}/metrics" if metrics else None
            command = build_command(
                self.installation,
                self.settings,
                self.repository,
                self._backend_dir,
                Ports(http=http, grpc=grpc, metrics=metrics),
            )
            process = TritonProcess(command, self.installation.env)
            await process.spawn()
            if self.client is not None:
                await self.client.close()
            self.client = TritonClient(f"http://127.0.0.1:{http}", self.settings.request_timeout_s)
            if self.stream_client is not None:
                await self.stream_client.close()
            self.stream_client = StreamClient(f"127.0.0.1:{grpc}")
            if await self._wait_live(process):
                return process
            code = await process.stop(5)
            if any(m in line for line in process.recent_lines for m in _BIND_FAILURE_MARKERS):
                log.warning("tritonserver could not bind port %d (attempt %d); trying another", http, attempt)
                taken.add(http)
                continue
            raise RuntimeError(f"tritonserver exited during start-up with status {code}")
        raise RuntimeError("tritonserver could not bind a loopback port after 5 attempts")

    async def _wait_live(self, process: TritonProcess) -> bool:
        assert self.client is not None
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if process.returncode is not None:
                return False
            if await self.client.server_live():
                return True
            await asyncio.sleep(0.1)
        return False

    async def _load_default_model(self) -> None:
        assert self.client is not None and self.default_model is not None
        started = time.monotonic()
        try:
            await self.client.load_model(self.default_model, self.settings.startup_timeout_s)
        except ServeError as exc:
            self.state = State.MODEL_FAILED
            log.error("model %s failed to load; /ping stays 503: %s", self.default_model, exc.message)
            return
        self.decoupled = await self.client.is_decoupled(self.default_model)
        self.state = State.READY
        log.info("model %s is ready (loaded in %.1f s)", self.default_model, time.monotonic() - started)

    async def _supervise(self) -> None:
        """Start Triton, load the model, watch both; restart Triton with back-off when it dies."""
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                self.process = await self._spawn()
            except Exception as exc:  # a crash loop must end in a log line and a failing /ping
                self.state = State.TRITON_DOWN
                log.error("tritonserver failed to start: %s; retrying in %.0f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if self.default_model is not None:
                await self._load_default_model()
                health = asyncio.create_task(self._watch_model_health(), name="model-health")
            else:
                if self.on_triton_ready is not None:
                    await self.on_triton_ready()
                self.state = State.READY
                health = None
            started = time.monotonic()
            try:
                code = await self.process.wait()
            finally:
                if health is not None:
                    health.cancel()
            if self._stopping.is_set():
                return
            self.state = State.TRITON_DOWN
            self.metrics.triton_restarts.inc()
            if time.monotonic() - started > 60:
                backoff = 1.0  # it ran fine for a while: this is a new failure, not a loop
            log.error("tritonserver exited unexpectedly (status %s); restarting in %.0f s", code, backoff)
            await self.process.stop(1)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _watch_model_health(self) -> None:
        """Keep the /ping flag true to Triton's view of the model (it may be unloaded or fail later)."""
        assert self.client is not None and self.default_model is not None
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            if self.state not in (State.READY, State.MODEL_FAILED):
                continue
            ready = await self.client.model_ready(self.default_model)
            if self.process is not None and self.process.returncode is not None:
                return
            if ready is not None and ready != (self.state is State.READY):
                self.state = State.READY if ready else State.MODEL_FAILED
                log.warning("model %s is %s", self.default_model, "ready" if ready else "no longer ready")

    # ----- data plane ------------------------------------------------------------------------
    def ready_client(self, model: str) -> TritonClient:
        """The client, if requests may go to Triton now (else 503)."""
        if self.state is not State.READY or self.client is None:
            raise NotReady(self._not_ready_message(model))
        return self.client

    def live_client(self) -> TritonClient:
        """The client while Triton runs (model loads need it before /ping is 200, e.g. to restore)."""
        if self.state is State.STOPPING or self.client is None or self.process is None:
            raise NotReady("Triton is not running")
        if self.process.returncode is not None:
            raise NotReady("Triton is restarting")
        return self.client

    async def forward(
        self, triton_name: str, body: bytes, content_type: str | None, custom_attributes: str | None = None
    ) -> UpstreamResponse:
        """Send one SageMaker-encoded request to a Triton model. The body goes through untouched,
        except that a large JSON request is re-encoded binary (:mod:`smtriton.serve.transcode`) and custom
        attributes are added to its parameters."""
        header_length = codec.request_header_length(content_type, len(body))
        client = self.ready_client(triton_name)
        if header_length is None and 0 < self.settings.transcode_json_min_bytes <= len(body):
            binary = transcode.to_binary(body)
            if binary is not None:
                body, header_length = binary
                self.metrics.transcoded.inc()
        if custom_attributes is not None:
            body, header_length = codec.add_request_parameter(body, header_length, CUSTOM_ATTRIBUTES, custom_attributes)
        return await client.infer(triton_name, body, header_length)

    def ready_stream_client(self, model: str) -> StreamClient:
        self.ready_client(model)
        assert self.stream_client is not None
        return self.stream_client

    async def instance_count(self) -> int:
        """Model instances Triton runs for the SME model (1 for an MME or when unknown)."""
        if self.default_model is None or self.state is not State.READY or self.client is None:
            return 1
        try:
            config = await self.client.model_config(self.default_model)
        except ServeError:
            return 1
        groups = config.get("instance_group") or []
        total = sum(int(g.get("count", 1)) for g in groups if isinstance(g, dict))  # type: ignore[union-attr]
        return max(1, total)

    def sme_model(self) -> str:
        """The model /invocations serves."""
        if self.default_model is None:
            raise BadRequest(
                "this is a multi-model endpoint: invoke a model with POST /models/<name>/invoke "
                "(TargetModel in boto3), or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
            )
        return self.default_model

    def _not_ready_message(self, model: str) -> str:
        if self.state is State.STOPPING:
            return "server is shutting down"
        if self.state is State.MODEL_FAILED:
            return f"model '{model}' is not ready"
        return f"model '{model}' is not ready yet (Triton is {self.state.value})"


def to_sagemaker(upstream: UpstreamResponse) -> tuple[int, str, bytes]:
    """SME mapping of a Triton answer: headers rewritten, Triton's status kept but parse errors → 400."""
    if upstream.status == 200:
        return 200, codec.response_content_type(upstream.header_length), upstream.body
    status = upstream.status
    if status == 500 and upstream.body.startswith(_PARSE_ERROR_PREFIXES):
        status = 400
    if not upstream.body.startswith(b'{"error":'):
        return (
            status,
            codec.JSON,
            error_body(upstream.body.decode("utf-8", errors="replace") or "inference failed"),
        )
    if b"::" in upstream.body:  # B14: re-encode only when a repository path must be stripped
        return status, codec.JSON, error_body(error_text(upstream.body))
    return status, codec.JSON, upstream.body
