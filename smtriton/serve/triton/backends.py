"""Assemble the backend directory tritonserver runs with.

A Triton build without a native backend still serves the same repository: a config with
``platform: "onnxruntime_onnx"`` resolves to backend ``onnxruntime``, and when
``<backend-dir>/onnxruntime/`` holds a ``model.py`` instead of ``libtriton_onnxruntime.so``, Triton runs
it through its Python backend. This module builds such a directory: the binary's own backends plus our
Python-based ones (``serve/triton/pybackends``) for exactly the backends the binary lacks.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from smtriton.serve.triton.installation import TritonInstallation, TritonNotFound

log = logging.getLogger("serve.triton")

PYBACKENDS = Path(__file__).parent / "pybackends"
PYTHON_BASED = ("onnxruntime", "pytorch", "tensorrt")


def _copy_python_backend(source: Path, stub: Path, target: Path) -> None:
    # Copies, not links: Triton refuses a backend library whose real path leaves the backend directory.
    target.mkdir()
    for item in source.iterdir():
        if item.is_file():
            shutil.copy2(item, target / item.name)
    shutil.copy2(stub, target / stub.name)


def assemble_backends(installation: TritonInstallation, target: Path) -> Path:
    """Return the directory to pass as ``--backend-directory``, building it under ``target`` if needed."""
    native = installation.native_backends()
    missing = [name for name in PYTHON_BASED if name not in native]
    if not missing and installation.python_stub is None and installation.backends is not None:
        return installation.backends  # NVIDIA's image: every backend is native, use it as it is.
    if "python" not in native or installation.backends is None:
        raise TritonNotFound(
            f"{installation.binary} has no Python backend, so the Python-based backends "
            f"({', '.join(missing)}) cannot run with it"
        )
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in sorted(native):
        source = installation.backends / name
        if name == "python" and installation.python_stub is not None:
            _copy_python_backend(source, installation.python_stub, target / name)
        else:
            (target / name).symlink_to(source.resolve(), target_is_directory=True)
    for name in missing:
        shutil.copytree(PYBACKENDS / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    log.info(
        "backends: native %s, Python-based %s (in %s)",
        ", ".join(sorted(native)) or "none",
        ", ".join(missing) or "none",
        target,
    )
    return target
