"""GPU tests (marked ``gpu``) run only where an NVIDIA GPU is visible; those also marked ``tensorrt`` need
the TensorRT Python package and cuda-python too.

Elsewhere each is skipped with the reason, so the suite passes on CPU-only hosts and CI. To run them:
inside the serving image on a GPU host, which is what ``bash scripts/gpu-proof.sh`` does (it installs
``.[tensorrt,convert,test]`` with the TensorRT package matching the image, then runs ``pytest tests/gpu``).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from functools import cache

import pytest


@cache
def gpu_unavailable() -> str | None:
    """Why no GPU test can run here, or None when they can."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver (nvidia-smi) on this host"
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0 or "GPU" not in probe.stdout:
        return f"no NVIDIA GPU visible: {probe.stderr.strip() or probe.stdout.strip()}"
    return None


@cache
def tensorrt_unavailable() -> str | None:
    """Why the TensorRT builds cannot run here (given a GPU), or None when they can."""
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    if importlib.util.find_spec("cuda") is None:
        return "cuda-python is not installed (pip install 'smtriton[tensorrt]')"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "gpu" in item.keywords:
            reason = gpu_unavailable() or ("tensorrt" in item.keywords and tensorrt_unavailable()) or None
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
