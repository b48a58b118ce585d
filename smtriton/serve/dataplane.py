"""The data plane: what the routes ask of Triton, with no HTTP in it.

Infer, generate and stream for the single model an SME serves; load, unload, list, describe and invoke
for the models of an MME (through :class:`~smtriton.serve.multimodel.ModelRegistry`). Requests go to
Triton as SageMaker sent them: the body untouched, except that a large JSON request is re-encoded
binary (:mod:`smtriton.serve.transcode`) and custom attributes are added to its parameters. Answers
come back as Triton gave them; mapping them to SageMaker's responses is the HTTP edge's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from smtriton.serve import codec, guard, streaming, transcode
from smtriton.serve.errors import BadRequest, ModelLoadFailed, NotReady, ServeError
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel import ModelRecord, ModelRegistry
from smtriton.serve.settings import Settings
from smtriton.serve.supervisor import TritonState, TritonSupervisor
from smtriton.serve.triton.client import TritonClient, UpstreamResponse

log = logging.getLogger("serve")

# docs/contract.md §7: the custom attributes header travels to the model as this request parameter,
# and a response parameter of the same name set by the model comes back as the header.
CUSTOM_ATTRIBUTES = "sagemaker_custom_attributes"
HEALTH_INTERVAL_S = 1.0


class DataPlane:
    """One endpoint's models on one supervised Triton: the SME ``default_model``, or an MME registry."""

    def __init__(
        self,
        settings: Settings,
        supervisor: TritonSupervisor,
        metrics: Metrics,
        default_model: str | None = None,
        registry: ModelRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.supervisor = supervisor
        self.metrics = metrics
        self.default_model = default_model
        self.registry = registry
        self.decoupled = False  # SME: the default model streams (decoupled transaction policy)
        self.model_ready = False  # SME: the default model is READY; MME: the registry is restored
        self.model_failed = False  # SME: the default model failed to load (or is no longer ready)
        self.draining = False

    # ----- lifecycle: the supervisor's hooks -----------------------------------------------------
    async def on_triton_live(self) -> None:
        """Triton (re)started: load the SME model, or restore the MME models, before /ping turns 200."""
        self.model_ready = self.model_failed = False
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
            log.error("model %s failed to load; /ping stays 503: %s", model, exc.message)
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
            process = self.supervisor.process
            if process is not None and process.returncode is not None:
                return
            if ready is not None and ready != self.model_ready:
                self.model_ready, self.model_failed = ready, not ready
                log.warning("model %s is %s", model, "ready" if ready else "no longer ready")

    def begin_drain(self) -> None:
        """SIGTERM arrived: /ping fails from now on so no new traffic is routed here; requests
        already accepted still run to completion before Triton is stopped."""
        self.draining = True

    @property
    def healthy(self) -> bool:
        """What /ping answers: Triton live and the served model READY (or live only, in live mode)."""
        if self.draining or not self.supervisor.live:
            return False
        if self.settings.ping_mode == "live":
            return self.model_ready or self.model_failed
        return self.model_ready

    # ----- single-model endpoint ----------------------------------------------------------------
    def sme_model(self) -> str:
        """The model /invocations serves."""
        if self.default_model is None:
            raise BadRequest(
                "this is a multi-model endpoint: invoke a model with POST /models/<name>/invoke "
                "(TargetModel in boto3), or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
            )
        return self.default_model

    def _ready_client(self, model: str) -> TritonClient:
        """The client, if requests may go to Triton now (else 503)."""
        client = self.supervisor.client
        if not self.supervisor.live or not self.model_ready or client is None:
            raise NotReady(self._not_ready_message(model))
        return client

    def _not_ready_message(self, model: str) -> str:
        state = self.supervisor.state
        if state is TritonState.STOPPING:
            return "server is shutting down"
        if self.model_failed:
            return f"model '{model}' is not ready"
        triton = "starting" if state is TritonState.LIVE else state.value
        return f"model '{model}' is not ready yet (Triton is {triton})"

    async def infer(
        self, triton_name: str, body: bytes, content_type: str | None, custom_attributes: str | None = None
    ) -> UpstreamResponse:
        """One SageMaker-encoded inference request to a Triton model."""
        header_length = codec.request_header_length(content_type, len(body))
        client = self._ready_client(triton_name)
        if header_length is None and 0 < self.settings.transcode_json_min_bytes <= len(body):
            binary = transcode.to_binary(body)  # also refuses a body nested too deep
            if binary is not None:
                body, header_length = binary
                self.metrics.transcoded.inc()
        elif header_length != 0:
            guard.check_json_depth(body, header_length)
        if custom_attributes is not None:
            body, header_length = codec.add_request_parameter(body, header_length, CUSTOM_ATTRIBUTES, custom_attributes)
        return await client.infer(triton_name, body, header_length)

    async def generate(self, model: str, body: bytes) -> UpstreamResponse:
        client = self._ready_client(model)
        guard.check_json_depth(body)
        return await client.generate(model, body)

    @contextlib.asynccontextmanager
    async def generate_stream(
        self, model: str, body: bytes
    ) -> AsyncIterator[tuple[UpstreamResponse | None, AsyncIterator[bytes] | None]]:
        """Triton's generate stream: ``(failure, None)`` with Triton's error answer, or ``(None, events)``
        with the server-sent events as they arrive; leaving the context early drops the upstream request."""
        client = self._ready_client(model)
        guard.check_json_depth(body)
        async with client.generate_stream(model, body) as upstream:
            if upstream.status != 200:
                payload = await upstream.read()
                yield UpstreamResponse(upstream.status, upstream.headers.get("Content-Type", ""), None, payload), None
                return
            yield None, upstream.content.iter_any()

    def stream(
        self, triton_name: str, body: bytes, content_type: str | None, custom_attributes: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """A decoupled model's responses, one KServe JSON response each, as Triton streams them."""
        header_length = codec.request_header_length(content_type, len(body))
        extra = {CUSTOM_ATTRIBUTES: custom_attributes} if custom_attributes is not None else None
        request = streaming.build_request(triton_name, body, header_length, extra)
        self._ready_client(triton_name)
        stream_client = self.supervisor.stream_client
        assert stream_client is not None
        return stream_client.stream(request)

    async def instance_count(self) -> int:
        """Model instances Triton runs for the SME model (1 for an MME or when unknown)."""
        if self.default_model is None or not self.model_ready or self.supervisor.client is None:
            return 1
        try:
            config = await self.supervisor.client.model_config(self.default_model)
        except ServeError:
            return 1
        groups = config.get("instance_group")
        total = 0
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, dict):
                total += int(group.get("count", 1))
        return max(1, total)

    # ----- multi-model endpoint -----------------------------------------------------------------
    def mme(self) -> ModelRegistry:
        if self.registry is None:
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        return self.registry

    def begin_invoke(self, name: str, target_model: str | None) -> ModelRecord:
        """Resolve an MME model for one invocation; pair with :meth:`end_invoke` (unloads wait for it)."""
        return self.mme().begin_invoke(name, target_model)

    def end_invoke(self, record: ModelRecord) -> None:
        self.mme().end_invoke(record)

    def invoke_oom(self, message: str) -> bool:
        return self.mme().invoke_oom(message)
