"""Stand-in for Triton's native ``tensorrt`` backend (``platform: "tensorrt_plan"``).

A TensorRT plan is compiled for one GPU architecture and TensorRT version; only the native backend on
an NVIDIA GPU can run it. On a host without both, Triton would otherwise fail the load with an
unhelpful "unable to find backend" message; this file turns that into a clear one. It never serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _has_nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


def load_error(model_name: str) -> str:
    """The load failure message for ``model_name`` on this host."""
    where = (
        "this host has an NVIDIA GPU but this Triton has no native tensorrt backend"
        if _has_nvidia_gpu()
        else "neither is present on this host"
    )
    return (
        f"a TensorRT plan needs an NVIDIA GPU and Triton's native tensorrt backend (NVIDIA's tritonserver "
        f"image); {where}, so model '{model_name}' cannot be loaded here"
    )


class TritonPythonModel:
    """Refuses to load: see the module docstring."""

    def initialize(self, args: dict[str, str]) -> None:
        name = args.get("model_name") or json.loads(args.get("model_config", "{}")).get("name", "?")
        raise RuntimeError(load_error(str(name)))

    def execute(self, requests: list[Any]) -> list[Any]:  # pragma: no cover - never loaded
        raise RuntimeError("unreachable: the tensorrt stand-in never loads")
