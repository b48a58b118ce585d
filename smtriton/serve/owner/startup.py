"""Which model a single-model endpoint serves: the start-up rules of docs/contract.md §1.5."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from smtriton.serve.errors import StartupError
from smtriton.serve.host.gpu import gpu_free_memory
from smtriton.serve.triton import shm
from smtriton.serve.triton.tensorrt_check import check_models, loaded_with

log = logging.getLogger("serve")


class RepositoryError(StartupError):
    """The model repository cannot be served as a single-model endpoint; `serve` exits 1."""


def model_directories(repository: Path) -> list[str]:
    """Model directories of a repository, sorted; hidden entries are not models."""
    return sorted(p.name for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))


def resolve_default_model(repository: Path, default_model: str | None) -> str:
    """Apply the native `serve` rules (same messages) and return the model to serve."""
    if not repository.is_dir():
        raise RepositoryError(f"ERROR: Model repository {repository} does not exist or is not a directory.")
    if (repository / "config.pbtxt").exists():
        raise RepositoryError(
            "ERROR: Incorrect directory structure. "
            f"{repository} must hold one directory per model, each with its config.pbtxt."
        )
    models = model_directories(repository)
    if default_model:
        if default_model not in models:
            raise RepositoryError(
                f"ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME {default_model} does not exist"
                f" (models there: {', '.join(models) or 'none'})"
            )
        return default_model
    if not models:
        raise RepositoryError("ERROR: No model found in model repository")
    if len(models) > 1:
        raise RepositoryError(
            "ERROR: More than 1 model directory found in model repository. "
            "Set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME (or --default-model) to one of: " + ", ".join(models)
        )
    # NVIDIA's words first (their tests look for them), then which model is served.
    log.warning("WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided; serving the only model, %s", models[0])
    return models[0]


def refuse_unrunnable_plans(repository: Path, model: str) -> None:
    """Exit before Triton loads a TensorRT plan built for another TensorRT version or GPU: the sidecar
    says why at once, where Triton would fail the load deep in its log and /ping would stay 503."""
    problems = check_models(loaded_with(repository, model))
    if problems:
        raise RepositoryError(f"ERROR: model {model} cannot be served on this host: " + "; ".join(problems))


def models_to_load(
    repository: Path, default_model: str, wanted: Sequence[str], additional_args: Sequence[str]
) -> list[str]:
    """Every model a single-model endpoint loads, the default one last: those ``SMTRITON_LOAD_MODELS``
    names (``*``: all of the repository) and those ``--load-model=`` flags name. A name the repository
    does not have stops `serve` with the models it has."""
    models = model_directories(repository)
    flagged = [arg.split("=", 1)[1] for arg in additional_args if arg.startswith("--load-model=")]
    names = models if "*" in wanted or "*" in flagged else [*wanted, *flagged]
    unknown = [name for name in names if name not in models]
    if unknown:
        raise RepositoryError(
            f"ERROR: SMTRITON_LOAD_MODELS names {', '.join(unknown)}, which {repository} does not hold "
            f"(models there: {', '.join(models) or 'none'})"
        )
    return [*dict.fromkeys(name for name in names if name != default_model), default_model]


def refuse_without_shared_memory(
    repository: Path, models: Sequence[str], region_bytes: int, native_backends: set[str]
) -> None:
    """Exit before Triton starts when the Python backend's instances of ``models`` (and their ensembles'
    steps) cannot fit in the free space of /dev/shm: one line with both numbers and what to change."""
    dirs = list(dict.fromkeys(d for model in models for d in loaded_with(repository, model)))
    problem = shm.shortfall(dirs, region_bytes, native_backends, len(gpu_free_memory()))
    if problem is not None:
        raise RepositoryError(f"ERROR: {problem}")
