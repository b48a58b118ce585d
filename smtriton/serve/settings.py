"""Every setting `serve` reads, declared once: variable, default, bounds and meaning, then one typed object.

The schema below (`Settings`, its `TritonOptions` in :mod:`smtriton.serve.triton_options`, both built of
:mod:`smtriton.serve.setting_types`) is the only place a setting is named. From it come the object built once
at start-up (`Settings.from_env`), the reference in docs/settings.md (:mod:`smtriton.serve.settings_reference`)
and the variables a deployment is checked against (`known_variables`).

SageMaker's variables (``SAGEMAKER_*``, ``SAGEMAKER_TRITON_*``) keep exactly the meaning of
docs/contract.md §1.4, but their values are parsed, not word-split into a command line
(docs/contract.md §6 B17). Settings owned by this project use the ``SMTRITON_`` prefix. Command-line
flags (local runs) override both. A value that is not understood stops `serve` with a message naming
the variable; an empty value means the variable is not set, as in SageMaker's own `serve` script.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from smtriton.serve.setting_types import (
    MIB,
    PORT_MAX,
    PORT_MIN,
    Boolean,
    Integer,
    Number,
    PortRange,
    SettingsError,
    Switch,
    parse_names,
    parse_ping_mode,
    parse_word,
    setting,
)
from smtriton.serve.triton_options import TritonOptions

SME_MODEL_DIR = Path("/opt/ml/model")
MME_MODEL_ROOT = Path("/opt/ml/models")
DEFAULT_PORT = 8080
# The slowest a body of the largest size may arrive at by default (SMTRITON_BODY_TIMEOUT_S): far below
# any network a SageMaker request crosses, far above a trickle that holds a connection open for long.
BODY_RATE = 4 * MIB

InferenceType = Literal["infer", "generate", "generate_stream"]
LogLevel = Literal["debug", "info", "warning", "error"]

# Variables SageMaker's `serve` accepts that do nothing here, and why: recognised (a deployment that
# sets one is not told it is unknown) and warned about at start-up, never silently dropped.
WITHOUT_EFFECT: dict[str, str] = {
    "SAGEMAKER_TRITON_ALLOW_GRPC": (
        "Triton's gRPC endpoint always runs, bound to loopback, because `serve` streams through it; "
        "only `serve`'s own port is reachable from outside the container"
    ),
}

log = logging.getLogger("serve.settings")


# The default worker count stops here: on a 16-core host 12 and 16 workers answered no more than 8 (the
# CPU per request, front and Triton, is the limit there: bench/NOTES.md Part 8), and each worker costs
# memory, upstream connections and one of Triton's HTTP threads.
MAX_DEFAULT_WORKERS = 8


def _default_workers() -> int:
    """Front workers when the setting is not given: one per two CPUs the container may use, so Triton
    keeps half of them, and no more than :data:`MAX_DEFAULT_WORKERS`."""
    from smtriton.serve.host.cgroups import available_cpus

    return min(MAX_DEFAULT_WORKERS, max(1, available_cpus() // 2))


# SageMaker's default MaxPayloadInMB: what `/execution-parameters` answers when the job sets none, and so
# the body limit under batch transform.
DEFAULT_BATCH_PAYLOAD_MB = 6
REAL_TIME_PAYLOAD_MB = 1024  # asynchronous inference's largest body: the limit outside batch transform


def _default_payload_mb(data: dict[str, Any]) -> int:
    """The body limit in MiB when ``SMTRITON_MAX_PAYLOAD_BYTES`` is not set: batch transform's
    MaxPayloadInMB under ``SAGEMAKER_BATCH`` (SageMaker's 6 when the job sets none; 0, "any size", keeps
    the real-time limit), else the real-time limit."""
    batch_mb = data.get("max_payload_in_mb")
    if batch_mb:
        return int(batch_mb)
    if data.get("batch") and batch_mb is None:
        return DEFAULT_BATCH_PAYLOAD_MB
    return REAL_TIME_PAYLOAD_MB


# A front worker's stop after its SIGTERM, part by part (StopBudget shares its drain between them):
UVICORN_PAUSES_S = 0.2  # uvicorn's own: a tick of its main loop before its shutdown, a pause after it
ACCEPT_GRACE_S = 2.0  # at most: queued connections accepted and requests on their way arrived
APP_CLOSE_S = 1.0  # at most: the app's shutdown (its upstream pool closed) and the process's exit


@dataclass(frozen=True)
class StopBudget:
    """One budget for the stop (``SMTRITON_SHUTDOWN_TIMEOUT_S``): the workers drain for ``drain_s``, then
    the pool kills one still there, and Triton exits in what remains, at least ``triton_s``.

    A worker's drain is shared so that its parts add up to ``drain_s`` (for a drain of 0.25 s or more):
    uvicorn's pauses, the accept grace, uvicorn's graceful wait for the requests under way (then it
    cancels them), and the app's shutdown, which closes the upstream pool before the pool's kill."""

    drain_s: float
    triton_s: float

    @property
    def accept_grace_s(self) -> float:
        """How long a draining worker accepts what the kernel queued and lets requests on their way arrive."""
        return min(ACCEPT_GRACE_S, self.drain_s / 10)

    @property
    def close_s(self) -> float:
        """Kept for the app's shutdown and the worker's exit, after the graceful wait."""
        return min(APP_CLOSE_S, self.drain_s / 10)

    @property
    def graceful_s(self) -> float:
        """uvicorn's graceful timeout: the rest of the drain, for the requests under way."""
        return max(0.0, self.drain_s - UVICORN_PAUSES_S - self.accept_grace_s - self.close_s)


class Settings(BaseSettings):
    """The whole configuration of one `serve` process."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    host: str = setting("SMTRITON_HOST", "address `serve` binds", "0.0.0.0", flag=True)
    port: Integer = setting(
        "SAGEMAKER_BIND_TO_PORT", "port `serve` listens on", DEFAULT_PORT, flag=True, ge=PORT_MIN, le=PORT_MAX
    )
    workers: Integer = setting(
        "SAGEMAKER_MODEL_SERVER_WORKERS",
        "front worker processes accepting on the port, all in front of the one Triton",
        default_factory=lambda data: _default_workers(),
        shown="one per two CPUs the container may use (its affinity and cgroup quota), at least 1, at most 8",
        flag=True,
        ge=1,
    )
    multi_model: Switch = setting(
        "SAGEMAKER_MULTI_MODEL",
        "exactly `true` selects a multi-model endpoint",
        False,
        flag=True,
        option="serve a multi-model endpoint: models loaded on request (`POST /models`) from under "
        "`--model-root`, instead of one model of `--model-repository`",
    )
    model_repository: Path = setting(
        "SMTRITON_MODEL_REPOSITORY",
        "model repository a single-model endpoint serves: only its default model is loaded (an ensemble "
        "with its steps' models), and those `SMTRITON_LOAD_MODELS` names",
        SME_MODEL_DIR,
        flag=True,
    )
    model_root: Path = setting(
        "SMTRITON_MODEL_ROOT", "multi-model endpoints: load urls must lie under it", MME_MODEL_ROOT, flag=True
    )
    memory_reserve_bytes: Integer = setting(
        "SMTRITON_MEMORY_RESERVE_BYTES",
        "multi-model: a load that would leave less host memory than this gets 507",
        512 * MIB,
        ge=0,
    )
    gpu_memory_reserve_bytes: Integer = setting(
        "SMTRITON_GPU_MEMORY_RESERVE_BYTES",
        "multi-model, on GPU hosts: a load gets 507 when no GPU has this much free (NVML)",
        1024 * MIB,
        ge=0,
    )
    model_memory_factor: Number = setting(
        "SMTRITON_MODEL_MEMORY_FACTOR",
        "multi-model: memory a load needs = the extracted model's size on disk (its files' blocks, never more "
        "than their sizes) times factor",
        1.0,
        gt=0,
    )
    model_memory_budget_bytes: Integer | None = setting(
        "SMTRITON_MODEL_MEMORY_BUDGET_BYTES",
        "multi-model: a load gets 507 when the estimates of the models loaded and loading would pass this",
        shown="off",
        ge=1,
    )
    max_concurrent_loads: Integer = setting(
        "SMTRITON_MAX_CONCURRENT_LOADS", "multi-model: loads running at once (others wait)", 2, ge=1
    )
    default_model: str | None = setting(
        "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "model `/invocations` serves", shown="the only model", flag=True
    )
    load_models: Annotated[tuple[str, ...], BeforeValidator(parse_names)] = setting(
        "SMTRITON_LOAD_MODELS",
        "single-model endpoints: models loaded beside the default one (comma-separated; `*`: every model of the "
        "repository), such as those a Python (BLS) model calls; `/ping` waits for all of them. "
        "`--load-model=` flags in `SAGEMAKER_TRITON_ADDITIONAL_ARGS` count too",
        (),
        shown="none",
    )
    ping_mode: Annotated[Literal["ready", "live"], BeforeValidator(parse_ping_mode)] = setting(
        # docs/contract.md §6 B1: native `serve` never exported the mode; both variables are honoured here.
        ("SAGEMAKER_TRITON_OVERRIDE_PING_MODE", "SAGEMAKER_TRITON_PING_MODE"),
        "`live`: `/ping` needs Triton live only; any other value means `ready`",
        "ready",
    )
    inference_type: Annotated[InferenceType, BeforeValidator(parse_word(str))] = setting(
        "SAGEMAKER_TRITON_INFERENCE_TYPE",
        "`infer`, `generate` or `generate_stream`: what `/invocations` calls",
        "infer",
        # NVIDIA's `serve` words this refusal so; their tests look for it.
        refusal="ERROR: Invalid {variable} '{value}'",
    )
    safe_port_range: PortRange | None = setting(
        "SAGEMAKER_SAFE_PORT_RANGE",
        "`LOW-HIGH` (ports 1 to 65535): Triton's loopback ports are picked inside it",
        shown="any free port",
    )
    batch: Switch = setting(
        "SAGEMAKER_BATCH",
        "exactly `true` under batch transform: the body limit is `SAGEMAKER_MAX_PAYLOAD_IN_MB` (6 MB when unset, "
        "as `/execution-parameters` answers), and a JSON body of several lines is read as one record a line",
        False,
    )
    batch_strategy: Annotated[
        Literal["MULTI_RECORD", "SINGLE_RECORD"] | None, BeforeValidator(parse_word(str.upper))
    ] = setting(
        "SAGEMAKER_BATCH_STRATEGY",
        "`MULTI_RECORD` or `SINGLE_RECORD`, answered by `/execution-parameters`",
        shown="`MULTI_RECORD`",
    )
    max_concurrent_transforms: Integer | None = setting(
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS",
        "answered by `/execution-parameters`",
        shown="the model's instance count",
        ge=1,
    )
    max_payload_in_mb: Integer | None = setting(
        "SAGEMAKER_MAX_PAYLOAD_IN_MB",
        "batch transform's payload limit in MB, answered by `/execution-parameters`: under `SAGEMAKER_BATCH=true` "
        "a larger body is 413; 0 (SageMaker's 'any size, chunked') is answered as 0, and bodies past "
        "`SMTRITON_MAX_PAYLOAD_BYTES` are still refused",
        shown="unset: `/execution-parameters` answers 6, and 6 MB is the limit under `SAGEMAKER_BATCH=true`",
        ge=0,
    )
    max_payload_bytes: Integer = setting(
        "SMTRITON_MAX_PAYLOAD_BYTES",
        "request body limit; larger → 413 before the body is read. The default admits what any SageMaker mode "
        "sends (asynchronous inference: up to 1 GB; real-time and serverless bodies are capped by the platform "
        "before they arrive). With `SAGEMAKER_BATCH=true`, a positive `SAGEMAKER_MAX_PAYLOAD_IN_MB` wins",
        default_factory=lambda data: _default_payload_mb(data) * MIB,
        shown="1 GiB; under `SAGEMAKER_BATCH=true`, `SAGEMAKER_MAX_PAYLOAD_IN_MB` MB (6 when unset)",
        ge=1,
    )
    failed_record: Annotated[Literal["fail", "error-line"], BeforeValidator(parse_word(str.lower))] = setting(
        "SMTRITON_FAILED_RECORD",
        "a record of a multi-record body (JSON Lines, CSV rows) that fails: `fail` answers the whole request with "
        "its status and an error naming its line, sending nothing more (the job fails, loudly); `error-line` writes "
        '`{"error": ...}` (at most 200 characters) in its place, a line per input line kept (503, 504, 507 still fail '
        "it, for SageMaker to retry; so does a CSV row that cannot be read, with 400). Every record is checked "
        "against its model before the first is sent: one Triton would refuse costs no Triton request",
        "fail",
    )
    records_in_flight: Integer = setting(
        "SMTRITON_RECORDS_IN_FLIGHT",
        "Triton requests one multi-record body keeps in flight at once (its records, merged as "
        "`SMTRITON_MERGE_REQUESTS` allows or alone; its CSV rows, `max_batch_size` a request)",
        16,
        ge=1,
    )
    max_header_bytes: Integer = setting(
        "SMTRITON_MAX_HEADER_BYTES", "request headers larger than this → 431 (a longer URL → 414)", 64 * 1024, ge=1024
    )
    client_timeout_s: Number = setting(
        "SMTRITON_CLIENT_TIMEOUT_S",
        "seconds a client may take to send a request's headers, or pause in its body, before a 408; "
        "a connection silent that long is closed",
        30.0,
        gt=0,
    )
    body_timeout_s: Number = setting(
        "SMTRITON_BODY_TIMEOUT_S",
        "seconds a request's whole body may take to arrive after its headers, however steadily it trickles: then 408",
        default_factory=lambda data: data.get("client_timeout_s", 30.0) + data.get("max_payload_bytes", 0) / BODY_RATE,
        shown="`SMTRITON_CLIENT_TIMEOUT_S` + the body limit at 4 MiB/s (286 s for 1 GiB)",
        gt=0,
    )
    session_ttl_s: Number = setting(
        "SMTRITON_SESSION_TTL_S",
        "seconds a stateful session lives after it opens (it ends sooner once idle past its model's "
        "`max_sequence_idle_microseconds`)",
        1200.0,
        gt=0,
    )
    transcode_json_min_bytes: Integer = setting(
        "SMTRITON_TRANSCODE_JSON_MIN_BYTES",
        "JSON requests this large are re-encoded binary before Triton sees them; 0: never",
        64 * 1024,
        ge=0,
    )
    merge_requests: Boolean = setting(
        "SMTRITON_MERGE_REQUESTS",
        "requests of a model that arrive while a worker's earlier ones are with Triton go as one Triton request, "
        "merged along the batch dimension, each client answered byte for byte as alone (floats as Triton's own "
        "batching computes them); only where Triton would batch them itself (`dynamic_batching`, `max_batch_size` ≥ 2) "
        "and the model's rows are each their own (an ONNX Runtime, PyTorch, TensorRT, TensorFlow or OpenVINO model, or "
        'a config with `smtriton_merge_rows` `"true"`; `"false"` keeps one model\'s apart). `false`: none merge',
        True,
    )
    merge_in_flight: Integer = setting(
        "SMTRITON_MERGE_IN_FLIGHT",
        "Triton requests kept in flight per model instance before merging the next (1 while its instances are under "
        "half busy), shared evenly among workers (each its share, rounded up, at least this); none waits below it",
        2,
        ge=1,
    )
    merge_max_row_ms: Number = setting(
        "SMTRITON_MERGE_MAX_ROW_MS",
        "a model's requests merge only while Triton executes a row of it in under this many milliseconds (its own "
        "statistics, read every 5 s while the model is used); past it, each request goes at once. 0: no bound",
        2.0,
        ge=0,
    )
    worker_keep_freed_bytes: Integer = setting(
        "SMTRITON_WORKER_KEEP_FREED_BYTES",
        "memory a front worker's allocator keeps for the next requests once freed (blocks up to 32 MiB come "
        "from its heap), given back after a couple of seconds without work; a 600 KB body then costs no fresh "
        "pages. 0: glibc's own policy",
        64 * MIB,
        ge=0,
    )
    worker_shm_input_bytes: Integer = setting(
        "SMTRITON_WORKER_SHM_INPUT_BYTES",
        "shared memory a front worker hands large binary inputs to Triton through, in pages of 1 MiB: a "
        "binary part of 64 KiB to 8 MiB takes the pages it needs instead of going in the HTTP body. A page "
        "takes memory of `/dev/shm` (and of the memory limit) when first used. 0: every input in the HTTP body",
        32 * MIB,
        ge=0,
    )
    tritonserver: Path | None = setting(
        "TRITONSERVER", "tritonserver binary to use", shown="`/opt/tritonserver/bin/tritonserver`, else the wheel's"
    )
    triton: TritonOptions = Field(default_factory=TritonOptions)
    work_dir: Path | None = setting(
        "SMTRITON_WORK_DIR", "where `serve` keeps its scratch (backend directory, MME repository)", shown="system temp"
    )
    metrics_port: Integer | None = setting(
        "SMTRITON_METRICS_PORT",
        "Prometheus `/metrics` on this port (front metrics and Triton's, re-exported)",
        shown="off",
        ge=PORT_MIN,
        le=PORT_MAX,
    )
    metrics_host: str = setting("SMTRITON_METRICS_HOST", "address of the metrics port", "127.0.0.1")
    log_level: Annotated[LogLevel, BeforeValidator(parse_word(str.lower))] = setting(
        "SMTRITON_LOG_LEVEL", "log level, `debug`, `info`, `warning` or `error`; Triton's too", "info", flag=True
    )
    log_format: Annotated[Literal["json", "text"], BeforeValidator(parse_word(str.lower))] = setting(
        "SMTRITON_LOG_FORMAT", "`json`: one JSON object per line (CloudWatch); `text` for humans", "json"
    )
    access_log: Boolean = setting("SMTRITON_ACCESS_LOG", "access log (never `/ping`)", False)
    startup_timeout_s: Number = setting(
        "SMTRITON_STARTUP_TIMEOUT_S",
        "seconds Triton's start and a model load may take: the most SageMaker waits for a container "
        "(`ContainerStartupHealthCheckTimeoutInSeconds` up to 3600)",
        3600.0,
        gt=0,
    )
    request_timeout_s: Number = setting(
        "SMTRITON_REQUEST_TIMEOUT_S",
        "seconds an inference may take upstream, then 504; the default admits the longest any SageMaker mode "
        "waits (asynchronous inference and batch transform: up to 3600 s; real-time ones are cut at 60 s by the "
        "platform). A client that goes away first cancels the upstream request",
        3600.0,
        gt=0,
    )
    wait_for_triton: Boolean = setting(
        "SMTRITON_WAIT_FOR_TRITON",
        "an inference that meets Triton restarting after a crash waits for it (within its own timeout) and one "
        "in flight when Triton died is sent again once (a request of a sequence: 503); `false`: 503 at once",
        True,
    )
    triton_wait_queue: Integer = setting(
        "SMTRITON_TRITON_WAIT_QUEUE",
        "inferences one front worker holds while Triton restarts; past it, 503 at once",
        1024,
        ge=1,
    )
    probation_lease_s: Number = setting(
        "SMTRITON_PROBATION_LEASE_S", "seconds a request sent again after a Triton death may hold its turn", 30.0, gt=0
    )
    shutdown_timeout_s: Number = setting(
        "SMTRITON_SHUTDOWN_TIMEOUT_S",
        "seconds the whole stop may take after SIGTERM, inside SageMaker's 30: the workers drain, then "
        "Triton gets the rest (at least `SMTRITON_TRITON_EXIT_TIMEOUT_S`, or half)",
        25.0,
        gt=0,
    )
    triton_exit_timeout_s: Number = setting(
        "SMTRITON_TRITON_EXIT_TIMEOUT_S",
        "seconds of the stop kept for Triton's own exit (at most half of it); then its process group gets SIGKILL",
        5.0,
        gt=0,
    )
    worker_heartbeat_timeout_s: Number = setting(
        "SMTRITON_WORKER_HEARTBEAT_TIMEOUT_S",
        "a front worker that does not answer the main process's heartbeat this long (stopped, or its event "
        "loop stuck) is killed and replaced",
        10.0,
        gt=0,
    )

    def stop_budget(self) -> StopBudget:
        """How the stop's seconds are shared between the workers' drain and Triton's exit."""
        triton = min(self.triton_exit_timeout_s, self.shutdown_timeout_s / 2)
        return StopBudget(drain_s=self.shutdown_timeout_s - triton, triton_s=triton)

    @field_validator("max_payload_bytes")
    @classmethod
    def _batch_payload_wins(cls, value: int, info: ValidationInfo) -> int:
        """Batch transform's MaxPayloadInMB is the limit under SAGEMAKER_BATCH, whatever else is set;
        0 means chunked, unbounded, to SageMaker, and leaves the limit as it is."""
        batch_mb = info.data.get("max_payload_in_mb") or 0
        return batch_mb * MIB if info.data.get("batch") and batch_mb > 0 else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments only: the environment is read by `from_env`, from the mapping it is given
        (never os.environ behind the caller's back), and there is no .env file or secrets directory."""
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: object) -> Settings:
        """Build the settings from an environment mapping; keyword overrides (CLI flags; None: not given) win."""
        flags = {name: value for name, value in overrides.items() if value is not None}
        unknown = set(flags) - {name for name, field in cls.model_fields.items() if extra_of(field).get("flag")}
        if unknown:
            raise TypeError(f"not settings a flag may override: {sorted(unknown)}")
        source = _Environment(cls, env)
        try:
            return cls(**(source() | flags))
        except ValidationError as exc:
            raise SettingsError(_explain(exc, source, flags)) from None


class _Environment(PydanticBaseSettingsSource):
    """The schema's variables in one environment mapping, keyed like the fields (Triton's options nested)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env = env
        self.origin: dict[tuple[str, ...], str] = {}  # field path -> the variable its value came from

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        for variable in variables_of(field):
            if self.env.get(variable):  # empty means unset
                return self.env[variable], variable, False
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for path, field in setting_fields(self.settings_cls):
            value, variable, _ = self.get_field_value(field, path[-1])
            if value is None:
                continue
            self.origin[path] = variable
            group = values
            for key in path[:-1]:
                group = group.setdefault(key, {})
            group[path[-1]] = value
        return values


def extra_of(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def variables_of(field: FieldInfo) -> tuple[str, ...]:
    """The variables a field is read from, in order of precedence; none for a group of fields."""
    names = extra_of(field).get("env", [])
    return tuple(str(name) for name in names) if isinstance(names, list) else ()


def setting_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    """Every field read from the environment, as (path, field), in declaration order."""
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from setting_fields(field.annotation, (*prefix, name))
        elif variables_of(field):
            yield (*prefix, name), field


def _field_at(path: tuple[str, ...]) -> FieldInfo | None:
    return dict(setting_fields(Settings)).get(path)


def _detail(error: ErrorDetails) -> str:
    ctx = error.get("ctx", {})
    kind = error["type"]
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "literal_error":
        return f"must be {ctx['expected']}"
    for bound, relation in (("ge", ">="), ("gt", ">"), ("le", "<=")):
        if bound in ctx:
            return f"must be {relation} {ctx[bound]:g}"
    return error["msg"]


def _explain(exc: ValidationError, source: _Environment, flags: Mapping[str, object]) -> str:
    """One line per refused value, naming the variable (or flag) and the value as it was given."""
    lines = []
    for error in exc.errors():
        if error["type"] == "default_factory_not_called":
            continue  # a default that depends on a refused value; that value has its own line
        path = tuple(part for part in error["loc"] if isinstance(part, str))
        detail = _detail(error)
        field = _field_at(path)
        if path and path[0] in flags:
            lines.append(f"--{path[0].replace('_', '-')}={flags[path[0]]}: {detail}")
        elif path in source.origin and field is not None:
            variable = source.origin[path]
            refusal = str(extra_of(field).get("refusal", "{variable}={value!r}"))
            lines.append(f"{refusal.format(variable=variable, value=source.env[variable])}: {detail}")
        else:
            lines.append(f"{'.'.join(path) or 'settings'}: {detail}")
    return "\n".join(lines)


# ----- what else the schema answers ------------------------------------------------------------------


def known_variables() -> frozenset[str]:
    """Every variable `serve` recognises: the schema's and those accepted without effect."""
    return frozenset(v for _, field in setting_fields(Settings) for v in variables_of(field)) | WITHOUT_EFFECT.keys()


def variables_without_effect(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, why) for each variable set in ``env`` that `serve` accepts but does not act on."""
    return [(name, why) for name, why in WITHOUT_EFFECT.items() if env.get(name)]


def warn_without_effect(env: Mapping[str, str]) -> None:
    """Log a warning per variable set that has no effect, so a deployment relying on one learns why."""
    for name, why in variables_without_effect(env):
        log.warning("%s is set but has no effect: %s", name, why)


def flag_help(name: str) -> str:
    """The help of `serve --<name>`: the setting's meaning, its default and the variables it overrides."""
    field = Settings.model_fields[name]
    variables = " or ".join(variables_of(field))
    meaning = extra_of(field).get("option") or field.description
    text = f"{meaning}. Default: {shown_default(field)}; overrides {variables}"
    text = text.replace("`", "").replace("—", "none")
    return text[:1].upper() + text[1:]


def environment_help() -> str:
    """Every variable `serve` reads, for its --help (defaults and meanings: docs/settings.md)."""
    names = [name for _, field in setting_fields(Settings) for name in variables_of(field)]
    return "Reads these environment variables (defaults and meanings: docs/settings.md): " + ", ".join(names) + "."


def shown_default(field: FieldInfo) -> str:
    shown = extra_of(field).get("shown")
    if shown is not None:
        return str(shown)
    value = field.get_default(call_default_factory=False)
    if value is None or value == ():
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 1024 and any("BYTE" in name for name in variables_of(field)):  # a size
        for unit, size in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", 1024)):
            if value % size == 0:
                return f"{value // size} {unit}"
    if isinstance(value, int | float):
        return f"{value:g}"
    return f"`{value}`"
