"""GPU tests (marked ``gpu``) run only where TensorRT, cuda-python and an NVIDIA GPU are all present.

Elsewhere each is skipped with the reason, so the suite passes on CPU-only hosts and CI. To run them:
inside the serving image on a GPU host, ``pip install -e '.[tensorrt,test]'`` then ``pytest tests/gpu``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from functools import cache

import pytest


@cache
def gpu_unavailable() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    if importlib.util.find_spec("cuda") is None:
        return "cuda-python is not installed (pip install 'smtriton[tensorrt]')"
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver (nvidia-smi) on this host"
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0 or "GPU" not in probe.stdout:
        return f"no NVIDIA GPU visible: {probe.stderr.strip() or probe.stdout.strip()}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
