"""NVIDIA GPUs as NVML sees them: free memory (MME load checks) and models (TensorRT plan checks).

NVML comes from nvidia-ml-py, imported lazily: a host without it, without a driver or without a GPU
simply has no GPUs here, never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def each_gpu(read: Callable[[ModuleType, object], T]) -> list[T]:
    """``read(pynvml, handle)`` for every GPU; empty where there is no GPU or no NVML."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        return [read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def gpu_free_memory() -> list[int]:
    """Free bytes of each GPU."""
    return each_gpu(lambda nvml, handle: int(nvml.nvmlDeviceGetMemoryInfo(handle).free))


def gpu_models() -> list[tuple[str, str]]:
    """(name, compute capability such as "8.6") of each GPU: what a TensorRT plan is built for."""

    def read(nvml: ModuleType, handle: object) -> tuple[str, str]:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return nvml_text(nvml.nvmlDeviceGetName(handle)), f"{major}.{minor}"

    return each_gpu(read)


def nvml_text(value: object) -> str:
    """A string NVML returned: bytes from older nvidia-ml-py releases, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)
