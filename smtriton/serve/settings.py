"""Every setting `serve` reads, typed, with its default: one object built once at start-up.

SageMaker's variables (``SAGEMAKER_*``, ``SAGEMAKER_TRITON_*``) keep exactly the meaning of
CONTRACT.md §1.4, but their values are parsed, not word-split into a command line (B17). Settings
owned by this project use the ``SMTRITON_`` prefix. Command-line flags (local runs) override both.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from smtriton.serve.errors import StartupError

SME_MODEL_DIR = Path("/opt/ml/model")
MME_MODEL_ROOT = Path("/opt/ml/models")
DEFAULT_PORT = 8080
MIB = 1024 * 1024

InferenceType = Literal["infer", "generate", "generate_stream"]


class SettingsError(StartupError):
    """A setting has a value that cannot be used; `serve` exits with this message."""


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true or false)")


def _int(name: str, raw: str, minimum: int = 0) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _float(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be > 0")
    return value


def _port(name: str, raw: str) -> int:
    value = _int(name, raw, minimum=1)
    if value > 65535:
        raise SettingsError(f"{name}={raw!r} is not a TCP port")
    return value


def _port_range(name: str, raw: str) -> tuple[int, int]:
    lo, sep, hi = raw.strip().partition("-")
    if not sep:
        raise SettingsError(f"{name}={raw!r} must look like LOW-HIGH")
    low, high = _port(name, lo), _port(name, hi)
    if low > high:
        raise SettingsError(f"{name}={raw!r}: LOW is above HIGH")
    return low, high


@dataclass(frozen=True)
class TritonOptions:
    """What `serve` passes on to tritonserver (CONTRACT.md §1.4 native variables)."""

    model_namespacing: bool | None = None
    allow_grpc: bool = False
    grpc_port: int | None = None
    allow_metrics: bool = False
    metrics_port: int | None = None
    buffer_manager_thread_count: int | None = None
    # `--sagemaker-thread-count` sized Triton's own SageMaker listener; ours is uvicorn, so the value
    # is kept only for compatibility and sizes Triton's loopback HTTP threads instead.
    thread_count: int | None = None
    log_verbose: int = 0
    log_info: bool | None = None
    log_warning: bool | None = None
    log_error: bool | None = None
    shm_default_byte_size: int = 16 * MIB
    shm_growth_byte_size: int = 1 * MIB
    tensorflow_version: str | None = None
    model_load_gpu_limit: float | None = None
    additional_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """The whole configuration of one `serve` process."""

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    multi_model: bool = False
    model_repository: Path = SME_MODEL_DIR
    model_root: Path = MME_MODEL_ROOT
    memory_reserve_bytes: int = 512 * MIB
    gpu_memory_reserve_bytes: int = 1024 * MIB
    model_memory_factor: float = 1.0
    model_memory_budget_bytes: int | None = None
    max_concurrent_loads: int = 2
    default_model: str | None = None
    ping_mode: Literal["ready", "live"] = "ready"
    inference_type: InferenceType = "infer"
    safe_port_range: tuple[int, int] | None = None
    batch: bool = False
    batch_strategy: Literal["MULTI_RECORD", "SINGLE_RECORD"] | None = None
    max_concurrent_transforms: int | None = None
    max_payload_in_mb: int | None = None
    max_payload_bytes: int = 100 * MIB
    max_header_bytes: int = 64 * 1024
    transcode_json_min_bytes: int = 64 * 1024
    tritonserver: Path | None = None
    triton: TritonOptions = field(default_factory=TritonOptions)
    work_dir: Path | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    log_level: str = "info"
    log_format: Literal["json", "text"] = "json"
    access_log: bool = False
    startup_timeout_s: float = 1800.0
    request_timeout_s: float = 60.0
    shutdown_timeout_s: float = 25.0
    triton_exit_timeout_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: object) -> Settings:
        """Build the settings from an environment mapping; keyword overrides (CLI flags) win."""
        settings = cls(
            host=env.get("SMTRITON_HOST", cls.host),
            port=_port("SAGEMAKER_BIND_TO_PORT", env["SAGEMAKER_BIND_TO_PORT"])
            if env.get("SAGEMAKER_BIND_TO_PORT")
            else DEFAULT_PORT,
            # CONTRACT.md §1.3: MME iff the value is exactly "true".
            multi_model=env.get("SAGEMAKER_MULTI_MODEL") == "true",
            model_repository=Path(env.get("SMTRITON_MODEL_REPOSITORY", str(SME_MODEL_DIR))),
            model_root=Path(env.get("SMTRITON_MODEL_ROOT", str(MME_MODEL_ROOT))),
            memory_reserve_bytes=_int(
                "SMTRITON_MEMORY_RESERVE_BYTES", env.get("SMTRITON_MEMORY_RESERVE_BYTES", str(512 * MIB))
            ),
            gpu_memory_reserve_bytes=_int(
                "SMTRITON_GPU_MEMORY_RESERVE_BYTES", env.get("SMTRITON_GPU_MEMORY_RESERVE_BYTES", str(1024 * MIB))
            ),
            model_memory_factor=_float("SMTRITON_MODEL_MEMORY_FACTOR", env.get("SMTRITON_MODEL_MEMORY_FACTOR", "1.0")),
            model_memory_budget_bytes=_int(
                "SMTRITON_MODEL_MEMORY_BUDGET_BYTES", env["SMTRITON_MODEL_MEMORY_BUDGET_BYTES"], minimum=1
            )
            if env.get("SMTRITON_MODEL_MEMORY_BUDGET_BYTES")
            else None,
            max_concurrent_loads=_int(
                "SMTRITON_MAX_CONCURRENT_LOADS", env.get("SMTRITON_MAX_CONCURRENT_LOADS", "2"), minimum=1
            ),
            default_model=env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") or None,
            ping_mode=_ping_mode(env),
            inference_type=_inference_type(env.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")),
            safe_port_range=_port_range("SAGEMAKER_SAFE_PORT_RANGE", env["SAGEMAKER_SAFE_PORT_RANGE"])
            if env.get("SAGEMAKER_SAFE_PORT_RANGE")
            else None,
            batch=env.get("SAGEMAKER_BATCH") == "true",
            batch_strategy=_batch_strategy(env.get("SAGEMAKER_BATCH_STRATEGY")),
            max_concurrent_transforms=_int(
                "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", env["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"], minimum=1
            )
            if env.get("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS")
            else None,
            max_payload_in_mb=_int("SAGEMAKER_MAX_PAYLOAD_IN_MB", env["SAGEMAKER_MAX_PAYLOAD_IN_MB"])
            if env.get("SAGEMAKER_MAX_PAYLOAD_IN_MB")
            else None,
            max_payload_bytes=_max_payload(env),
            max_header_bytes=_int(
                "SMTRITON_MAX_HEADER_BYTES", env.get("SMTRITON_MAX_HEADER_BYTES", "65536"), minimum=1024
            ),
            transcode_json_min_bytes=_int(
                "SMTRITON_TRANSCODE_JSON_MIN_BYTES", env.get("SMTRITON_TRANSCODE_JSON_MIN_BYTES", "65536")
            ),
            tritonserver=Path(env["TRITONSERVER"]) if env.get("TRITONSERVER") else None,
            triton=_triton_options(env),
            work_dir=Path(env["SMTRITON_WORK_DIR"]) if env.get("SMTRITON_WORK_DIR") else None,
            metrics_port=_port("SMTRITON_METRICS_PORT", env["SMTRITON_METRICS_PORT"])
            if env.get("SMTRITON_METRICS_PORT")
            else None,
            metrics_host=env.get("SMTRITON_METRICS_HOST", "127.0.0.1"),
            log_level=env.get("SMTRITON_LOG_LEVEL", "info").lower(),
            log_format="text" if env.get("SMTRITON_LOG_FORMAT", "json").strip().lower() == "text" else "json",
            access_log=_bool("SMTRITON_ACCESS_LOG", env["SMTRITON_ACCESS_LOG"])
            if env.get("SMTRITON_ACCESS_LOG")
            else False,
            startup_timeout_s=_float("SMTRITON_STARTUP_TIMEOUT_S", env.get("SMTRITON_STARTUP_TIMEOUT_S", "1800")),
            request_timeout_s=_float(
                "SMTRITON_REQUEST_TIMEOUT_S",
                env.get("SMTRITON_REQUEST_TIMEOUT_S", "600" if env.get("SAGEMAKER_BATCH") == "true" else "60"),
            ),
            shutdown_timeout_s=_float("SMTRITON_SHUTDOWN_TIMEOUT_S", env.get("SMTRITON_SHUTDOWN_TIMEOUT_S", "25")),
            triton_exit_timeout_s=_float(
                "SMTRITON_TRITON_EXIT_TIMEOUT_S", env.get("SMTRITON_TRITON_EXIT_TIMEOUT_S", "10")
            ),
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        for key in ("model_repository", "model_root"):
            if key in given:
                given[key] = Path(str(given[key]))
        settings = replace(settings, **given)  # type: ignore[arg-type]
        if settings.log_level not in ("debug", "info", "warning", "error"):
            raise SettingsError(f"log level {settings.log_level!r} is not one of debug, info, warning, error")
        return settings


def _ping_mode(env: Mapping[str, str]) -> Literal["ready", "live"]:
    # B1: native `serve` never exported the mode; both variables are honoured here, override first.
    raw = env.get("SAGEMAKER_TRITON_OVERRIDE_PING_MODE") or env.get("SAGEMAKER_TRITON_PING_MODE") or "ready"
    return "live" if raw.strip().lower() == "live" else "ready"


def _inference_type(raw: str) -> InferenceType:
    value = raw.strip()
    if value not in ("infer", "generate", "generate_stream"):
        raise SettingsError(f"SAGEMAKER_TRITON_INFERENCE_TYPE={raw!r} must be one of infer, generate, generate_stream")
    return value  # type: ignore[return-value]


def _max_payload(env: Mapping[str, str]) -> int:
    """Batch transform's MaxPayloadInMB wins under SAGEMAKER_BATCH; else ours; else 100 MiB."""
    batch_mb = 0
    if env.get("SAGEMAKER_MAX_PAYLOAD_IN_MB"):
        # 0 means chunked, unbounded, to SageMaker; the default bound stays then.
        batch_mb = _int("SAGEMAKER_MAX_PAYLOAD_IN_MB", env["SAGEMAKER_MAX_PAYLOAD_IN_MB"], minimum=0)
    if env.get("SAGEMAKER_BATCH") == "true" and batch_mb > 0:
        return batch_mb * MIB
    if env.get("SMTRITON_MAX_PAYLOAD_BYTES"):
        return _int("SMTRITON_MAX_PAYLOAD_BYTES", env["SMTRITON_MAX_PAYLOAD_BYTES"], minimum=1)
    return batch_mb * MIB if batch_mb > 0 else 100 * MIB


def _batch_strategy(raw: str | None) -> Literal["MULTI_RECORD", "SINGLE_RECORD"] | None:
    if not raw:
        return None
    value = raw.strip().upper()
    if value not in ("MULTI_RECORD", "SINGLE_RECORD"):
        raise SettingsError(f"SAGEMAKER_BATCH_STRATEGY={raw!r} must be MULTI_RECORD or SINGLE_RECORD")
    return value  # type: ignore[return-value]


def _opt(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value.strip() if value and value.strip() else None


def _triton_options(env: Mapping[str, str]) -> TritonOptions:
    def b(name: str) -> bool | None:
        raw = _opt(env, name)
        return None if raw is None else _bool(name, raw)

    def i(name: str) -> int | None:
        raw = _opt(env, name)
        return None if raw is None else _int(name, raw)

    def p(name: str) -> int | None:
        raw = _opt(env, name)
        return None if raw is None else _port(name, raw)

    verbose_raw = _opt(env, "SAGEMAKER_TRITON_LOG_VERBOSE")
    if verbose_raw is None:
        log_verbose = 0  # B18: native turns verbose on by default (a log line per request).
    elif verbose_raw.lower() in ("true", "false"):
        log_verbose = int(verbose_raw.lower() == "true")
    else:
        log_verbose = _int("SAGEMAKER_TRITON_LOG_VERBOSE", verbose_raw)
    gpu_limit = _opt(env, "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT")
    namespacing = b("SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING")
    return TritonOptions(
        # Native passes the value straight to --model-namespacing (so "false" disables it).
        model_namespacing=namespacing,
        allow_grpc=bool(b("SAGEMAKER_TRITON_ALLOW_GRPC")),
        grpc_port=p("SAGEMAKER_TRITON_GRPC_PORT"),
        allow_metrics=bool(b("SAGEMAKER_TRITON_ALLOW_METRICS")),
        metrics_port=p("SAGEMAKER_TRITON_METRICS_PORT"),
        buffer_manager_thread_count=i("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT"),
        thread_count=i("SAGEMAKER_TRITON_THREAD_COUNT"),
        log_verbose=log_verbose,
        log_info=b("SAGEMAKER_TRITON_LOG_INFO"),
        log_warning=b("SAGEMAKER_TRITON_LOG_WARNING"),
        log_error=b("SAGEMAKER_TRITON_LOG_ERROR"),
        shm_default_byte_size=i("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or 16 * MIB,
        shm_growth_byte_size=i("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or 1 * MIB,
        tensorflow_version=_opt(env, "SAGEMAKER_TRITON_TENSORFLOW_VERSION"),
        model_load_gpu_limit=_float("SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT", gpu_limit) if gpu_limit else None,
        additional_args=tuple(shlex.split(env.get("SAGEMAKER_TRITON_ADDITIONAL_ARGS", ""))),
    )
