"""The shared memory of Triton's Python backend: named so that `serve` knows its own, removed when the
Triton that made it is gone.

Every Python model instance (and, on a Triton without native backends, every ONNX and TorchScript
one: they run on Python-based backends) talks to its stub process through a region in ``/dev/shm``,
16 MiB by default. Triton removes them when it stops cleanly; a Triton that is killed (the OOM killer,
a lying request) leaves them behind, and on a container's small ``/dev/shm`` a few such crashes leave
no room for any Python model to load. `serve` therefore gives each Triton it starts a region prefix
of its own (``--backend-config=python,shm-region-prefix-name=``): once that Triton and its stubs are
gone, whatever still carries the prefix is theirs and is removed, before the next Triton starts and
when `serve` stops.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("serve.triton")

SHM_DIR = Path("/dev/shm")
PREFIX_OPTION = "shm-region-prefix-name="
# Triton's own default prefix, kept at the front so the regions read as the Python backend's.
TRITON_PREFIX = "triton_python_backend_shm_region_"


def new_prefix() -> str:
    """A region prefix no other `serve` (or Triton) uses."""
    return f"{TRITON_PREFIX}smtriton-{secrets.token_hex(6)}-"


def given_prefix(additional_args: Sequence[str]) -> str | None:
    """The prefix a deployment set itself through ``SAGEMAKER_TRITON_ADDITIONAL_ARGS``, if any."""
    for arg in additional_args:
        _, found, value = arg.partition(PREFIX_OPTION)
        if found and arg.lstrip("-").startswith("backend-config") and value:
            return value
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
