"""The settings `serve` passes on to tritonserver: the native image's ``SAGEMAKER_TRITON_*`` variables
(docs/contract.md §1.4), a group of the one settings schema (:class:`smtriton.serve.settings.Settings`,
its ``triton``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from smtriton.serve.setting_types import (
    MIB,
    PORT_MAX,
    PORT_MIN,
    Boolean,
    Integer,
    Number,
    parse_shell_words,
    parse_verbosity,
    parse_word,
    setting,
)


class TritonOptions(BaseModel):
    """What `serve` passes on to tritonserver (docs/contract.md §1.4 native variables)."""

    # Frozen: the settings are built once and shared.
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_namespacing: Boolean | None = setting(
        "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING",
        # Native passes the value straight to --model-namespacing, so "false" disables it.
        "`--model-namespacing=<value>` (as native: `false` turns namespacing off)",
        shown="Triton's",
    )
    grpc_port: Integer | None = setting(
        "SAGEMAKER_TRITON_GRPC_PORT",
        "Triton's gRPC port, always on and loopback only (streaming goes through it)",
        shown="picked",
        ge=PORT_MIN,
        le=PORT_MAX,
    )
    allow_metrics: Boolean = setting(
        "SAGEMAKER_TRITON_ALLOW_METRICS", "Triton's metrics endpoint, loopback only", False
    )
    metrics_port: Integer | None = setting(
        "SAGEMAKER_TRITON_METRICS_PORT", "port of Triton's metrics endpoint", shown="picked", ge=PORT_MIN, le=PORT_MAX
    )
    buffer_manager_thread_count: Integer | None = setting(
        "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "`--buffer-manager-thread-count`", shown="Triton's", ge=0
    )
    # Native's `--sagemaker-thread-count` sized Triton's own SageMaker listener; ours is uvicorn, so the value
    # is kept for compatibility and sizes Triton's loopback HTTP threads instead.
    thread_count: Integer | None = setting(
        "SAGEMAKER_TRITON_THREAD_COUNT",
        "sizes Triton's loopback HTTP threads",
        shown="Triton's 8, or one a front worker past 8",
        ge=1,
    )
    log_verbose: Annotated[int, BeforeValidator(parse_verbosity)] = setting(
        "SAGEMAKER_TRITON_LOG_VERBOSE",
        # docs/contract.md §6 B18: native turns verbose on by default (a log line per request).
        "Triton `--log-verbose`: `true`, `false` or a level (native's default is on: a line per request)",
        0,
        ge=0,
    )
    log_info: Boolean | None = setting(
        "SAGEMAKER_TRITON_LOG_INFO", "Triton `--log-info`", shown="from `SMTRITON_LOG_LEVEL`"
    )
    log_warning: Boolean | None = setting(
        "SAGEMAKER_TRITON_LOG_WARNING", "Triton `--log-warning`", shown="from `SMTRITON_LOG_LEVEL`"
    )
    log_error: Boolean | None = setting("SAGEMAKER_TRITON_LOG_ERROR", "Triton `--log-error`", shown="Triton's")
    shm_default_byte_size: Integer = setting(
        "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE", "Python backend shared memory: initial size", 16 * MIB, ge=1
    )
    shm_growth_byte_size: Integer = setting(
        "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE", "Python backend shared memory: growth step", 1 * MIB, ge=1
    )
    tensorflow_version: Annotated[str | None, BeforeValidator(parse_word(str))] = setting(
        "SAGEMAKER_TRITON_TENSORFLOW_VERSION", "`--backend-config=tensorflow,version=<value>`"
    )
    model_load_gpu_limit: Number | None = setting(
        "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT", "`--model-load-gpu-limit` for every GPU (a fraction)", gt=0
    )
    additional_args: Annotated[tuple[str, ...], BeforeValidator(parse_shell_words)] = setting(
        "SAGEMAKER_TRITON_ADDITIONAL_ARGS", "extra tritonserver flags, split shell-style", ()
    )
