"""The shared memory of Triton's Python backend: what models need of it, checked before they load;
named so that `serve` knows its own, and removed when the Triton that made it is gone.

Every Python model instance (and, on a Triton without native backends, every ONNX and TorchScript
one: they run on Python-based backends) talks to its stub process through a region in ``/dev/shm``,
16 MiB by default. Triton removes them when it stops cleanly; a Triton that is killed (the OOM killer,
a lying request) leaves them behind, and on a container's small ``/dev/shm`` a few such crashes leave
no room for any Python model to load. `serve` therefore gives each Triton it starts a region prefix
of its own (``--backend-config=python,shm-region-prefix-name=``): once that Triton and its stubs are
gone, whatever still carries the prefix is theirs and is removed, before the next Triton starts and
when `serve` stops.

SageMaker has no `--shm-size`: a container gets the platform's `/dev/shm`, and Triton's own refusal when
it is too small ("Unable to initialize shared memory", deep in its log, the model unavailable) says
nothing of what to change. So before a single-model endpoint starts, and before a multi-model load,
what the models' instances will take (one region of ``SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE`` each) is
compared with what ``/dev/shm`` has free, and a shortfall is refused in one line with both numbers.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

from smtriton import model_config
from smtriton.model_config import ConfigParseError

log = logging.getLogger("serve.triton")

SHM_DIR = Path("/dev/shm")
PREFIX_OPTION = "shm-region-prefix-name="
# Triton's own default prefix, kept at the front so the regions read as the Python backend's.
TRITON_PREFIX = "triton_python_backend_shm_region_"
MIB = 1 << 20


def new_prefix() -> str:
    """A region prefix no other `serve` (or Triton) uses."""
    return f"{TRITON_PREFIX}smtriton-{secrets.token_hex(6)}-"


def given_prefix(additional_args: Sequence[str]) -> str | None:
    """The prefix a deployment set itself through ``SAGEMAKER_TRITON_ADDITIONAL_ARGS``, if any: the
    Python backend's ``shm-region-prefix-name``, given as ``--backend-config=python,...`` or as the
    option and its value in two words (``--backend-config python,...``), as Triton reads both."""
    args = list(additional_args)
    for index, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        if option != "--backend-config":
            continue
        if not equals:
            value = args[index + 1] if index + 1 < len(args) else ""
        backend, _, setting = value.partition(",")
        name, found, prefix = setting.partition("=")
        if backend == "python" and found and f"{name}=" == PREFIX_OPTION and prefix:
            return prefix
    return None


def remove_regions(prefix: str, directory: Path = SHM_DIR) -> int:
    """Remove the regions named ``prefix*`` (call only when no Triton started with that prefix runs);
    how many bytes they held."""
    freed = removed = 0
    try:
        entries = list(directory.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            size = entry.stat().st_size
            entry.unlink()
        except OSError:
            continue
        freed += size
        removed += 1
    if removed:
        log.info(
            "removed %d shared-memory region%s of a stopped Triton from %s (%d MiB)",
            removed,
            "s" * (removed != 1),
            directory,
            freed >> 20,
        )
    return freed


def python_instances(model_dir: Path, native_backends: set[str], gpus: int) -> int:
    """How many stubs of the Python backend ``model_dir``'s model runs: its instances when it is a
    Python model, or runs on a Python-based backend (one the Triton binary lacks natively); else 0."""
    try:
        config = model_config.read(model_dir)
    except (ConfigParseError, OSError):
        return 0  # Triton refuses it itself
    backend = model_config.backend_of(config)
    if backend != "python" and (not backend or backend in native_backends):
        return 0
    if not config.instance_group:
        return max(1, gpus)
    total = 0
    for group in config.instance_group:
        count = group.count or 1
        gpu_group = group.kind == group.KIND_GPU or (group.kind == group.KIND_AUTO and gpus > 0)
        total += count * (len(group.gpus) or max(1, gpus)) if gpu_group else count
    return total


def free_bytes(directory: Path = SHM_DIR) -> int | None:
    """Bytes ``directory`` (a tmpfs) has free; None where it cannot be told."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def shortfall(
    model_dirs: Iterable[Path], region_bytes: int, native_backends: set[str], gpus: int, directory: Path = SHM_DIR
) -> str | None:
    """Why these models' Python-backend instances cannot fit in ``directory``'s free space, or None."""
    instances = sum(python_instances(model_dir, native_backends, gpus) for model_dir in model_dirs)
    free = free_bytes(directory)
    needed = instances * region_bytes
    if free is None or needed <= free:
        return None
    return (
        f"the Python backend needs {needed // MIB} MiB of shared memory for {instances} model instance"
        f"{'s' * (instances != 1)} ({region_bytes // MIB} MiB each, SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE) and "
        f"{directory} has {free // MIB} MiB free: give the container more shared memory, lower "
        "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE, or run fewer instances"
    )
