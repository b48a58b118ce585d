"""Refuse TensorRT plans this host cannot run, with a clear message, before Triton tries to load them.

A plan from another TensorRT version or GPU fails deep inside Triton with a deserialization error. The
sidecar the builder writes (:mod:`smtriton.serve.triton.tensorrt_sidecar`) says what the plan needs, so
`serve` compares it with this host first: an SME exits 1 at start-up, an MME load answers 400. A plan without a sidecar
(built elsewhere) or with one `serve` cannot read is let through with a warning: only what is known
not to run is refused.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from smtriton import model_config
from smtriton.model_config import ConfigParseError, ModelConfig
from smtriton.serve.host.gpu import gpu_models
from smtriton.serve.triton.tensorrt_sidecar import (
    RuntimeInfo,
    SidecarError,
    check_compatibility,
    read_sidecar,
    sidecar_path,
)

log = logging.getLogger("serve")

PLAN_FILENAME = "model.plan"  # Triton's default for the tensorrt backend
LIBNVINFER_MAJORS = (11, 10, 9, 8)  # libnvinfer.so.<major> sonames to look for, newest first


@dataclass(frozen=True)
class NoRuntime:
    """Why no TensorRT plan can run on this host."""

    reason: str  # "this host has no TensorRT runtime (libnvinfer) and no NVIDIA GPU"


Runtime = RuntimeInfo | NoRuntime


def decode_lib_version(number: int) -> str:
    """``getInferLibVersion()`` as "major.minor.patch": major*10000+minor*100+patch from TensorRT 10 on
    (and 9), major*1000+minor*100+patch before."""
    scale = 10000 if number >= 10000 else 1000
    return f"{number // scale}.{number % scale // 100}.{number % 100}"


def tensorrt_version() -> str | None:
    """The TensorRT the native backend would run plans with: libnvinfer through the dynamic loader,
    else the tensorrt Python module; None where neither exists."""
    for major in LIBNVINFER_MAJORS:
        try:
            get_version = ctypes.CDLL(f"libnvinfer.so.{major}").getInferLibVersion
        except (OSError, AttributeError):
            continue
        get_version.restype = ctypes.c_int32
        get_version.argtypes = []
        return decode_lib_version(int(get_version()))
    if importlib.util.find_spec("tensorrt") is None:
        return None
    try:
        import tensorrt
    except Exception:  # a broken install runs no plan either
        return None
    return str(tensorrt.__version__)


@functools.cache
def detect_runtime() -> Runtime:
    """This host's TensorRT version and (first) GPU, detected once per process and only when a
    sidecar needs comparing; a SageMaker instance carries one GPU model."""
    version = tensorrt_version()
    gpus = gpu_models()
    if version is None or not gpus:
        missing = ["no TensorRT runtime (libnvinfer)"] if version is None else []
        missing += [] if gpus else ["no NVIDIA GPU"]
        return NoRuntime("this host has " + " and ".join(missing))
    name, capability = gpus[0]
    return RuntimeInfo(version, name, capability)


def read_config(model_dir: Path) -> ModelConfig | None:
    """The model's config.pbtxt as Triton's ModelConfig; None if it is missing or does not parse
    (Triton, or MME staging, reports that itself)."""
    try:
        return model_config.read(model_dir / model_config.CONFIG_FILE)
    except (OSError, ConfigParseError):
        return None


def _version_dirs(model_dir: Path) -> list[Path]:
    return sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def served_versions(config: ModelConfig, model_dir: Path) -> list[Path]:
    """The version directories Triton loads under the config's version policy (default: the latest);
    a plan in a version it skips cannot stop the model from serving."""
    versions = _version_dirs(model_dir)
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return versions
    if choice == "specific":
        return [v for v in versions if int(v.name) in set(policy.specific.versions)]
    latest = policy.latest.num_versions if choice == "latest" else 1
    return versions[-latest:] if latest > 0 else []


def is_tensorrt(config: ModelConfig, model_dir: Path) -> bool:
    """Served by the tensorrt backend: by platform or backend, or (neither given) by the plan Triton's
    auto-complete would find."""
    if config.platform or config.backend:
        return bool(config.platform == "tensorrt_plan" or config.backend == "tensorrt")
    filename: str = config.default_model_filename or PLAN_FILENAME
    return filename.endswith(".plan") and any((v / filename).is_file() for v in _version_dirs(model_dir))


def check_model(model_dir: Path, runtime: Runtime | None = None) -> list[str]:
    """Why the TensorRT plans of ``model_dir`` cannot run here; empty when they can or it has none.

    ``runtime`` defaults to this host's, detected only once a sidecar needs it.
    """
    config = read_config(model_dir)
    if config is None or not is_tensorrt(config, model_dir):
        return []

    def here() -> Runtime:
        return runtime if runtime is not None else detect_runtime()  # detected lazily, cached

    filename = config.default_model_filename or PLAN_FILENAME
    if config.cc_model_filenames and isinstance(host := here(), RuntimeInfo):
        filename = config.cc_model_filenames.get(host.compute_capability, filename)  # Triton's choice per GPU
    problems: list[str] = []
    for version in served_versions(config, model_dir):
        plan = version / filename
        label = f"{model_dir.name}/{version.name}/{filename}"
        if not plan.is_file():
            continue  # Triton reports a missing plan itself
        try:
            sidecar = read_sidecar(plan)
        except SidecarError as exc:
            log.warning("%s: its sidecar cannot be read (%s); loading it unchecked", label, exc)
            continue
        if sidecar is None:
            log.warning(
                "%s has no sidecar (%s): its TensorRT version and GPU are not checked before loading",
                label,
                sidecar_path(plan).name,
            )
            continue
        host = here()
        if isinstance(host, NoRuntime):
            problems.append(
                f"{label} was built for {sidecar.gpu_name} (compute capability {sidecar.compute_capability}) "
                f"with TensorRT {sidecar.tensorrt_version}, and {host.reason}"
            )
        else:
            problems.extend(f"{label}: {message}" for message in check_compatibility(sidecar, host))
    return problems


def check_models(model_dirs: Iterable[Path], runtime: Runtime | None = None) -> list[str]:
    """:func:`check_model` over several directories (an MME archive loads all of them)."""
    return [problem for model_dir in model_dirs for problem in check_model(model_dir, runtime)]


def loaded_with(repository: Path, model: str) -> list[Path]:
    """The model directories Triton loads for ``model``: it and, for an ensemble, its steps' models."""
    found: list[Path] = []
    pending = [model]
    while pending:
        name = pending.pop()
        model_dir = repository / name
        if "/" in name or name in ("", ".", "..") or model_dir in found or not model_dir.is_dir():
            continue  # only model directories of this repository (Triton refuses other names itself)
        found.append(model_dir)
        config = read_config(model_dir)
        if config is not None:
            pending.extend(step.model_name for step in config.ensemble_scheduling.step)
    return found
