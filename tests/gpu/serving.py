"""What the GPU tests share: serve started and stopped, where Triton put a model's instance, and the GPUs'
memory as NVML (which serve uses) reads it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from smtriton.serve.host.gpu import each_gpu
from tests.integration.harness import ServeProcess

MIB = 1 << 20
# A table this large makes a model's GPU memory stand out from a CUDA context and whatever else is there.
BIG_ROWS = 1 << 16
BIG_WIDTH = 1024  # 256 MiB of FP32


def start(tmp: Path, repository: Path | None, model: str | None, **kwargs) -> ServeProcess:
    """serve on ``repository``, healthy, or stopped with its children and the failure raised."""
    server = ServeProcess(repository, model, tmp / "serve.log", **kwargs)
    try:
        server.wait_healthy(300)
    except BaseException:
        server.stop()
        raise
    return server


def on_gpu(server: ServeProcess, model: str) -> bool:
    """Triton's log says the model's instance was created on a GPU."""
    pattern = rf"ModelInstanceInitialize: {re.escape(model)}\S* \(GPU device \d+\)"
    return re.search(pattern, server.log_text()) is not None


def gpu_memory() -> list[tuple[int, int, int]]:
    """(used, free, total) bytes of each GPU, through NVML as serve reads it."""

    def read(nvml, handle) -> tuple[int, int, int]:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.used), int(info.free), int(info.total)

    memory = each_gpu(read)
    if not memory:
        pytest.fail("nvidia-smi sees a GPU but NVML (nvidia-ml-py, which serve uses) does not")
    return memory


def gpu_used() -> int:
    """Bytes used on all GPUs together."""
    return sum(used for used, _, _ in gpu_memory())


def settles(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether ``predicate`` comes true within ``timeout`` seconds (polled every half second)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
