"""smtriton.serve.host.gpu: what NVML says about each GPU, and nothing (never an error) where NVML cannot answer."""

from __future__ import annotations

import sys
import types

from smtriton.serve.host import gpu


class NVMLError(Exception):
    pass


def fake_nvml(monkeypatch, **device_reads) -> types.SimpleNamespace:
    """Two GPUs, handles 0 and 1, answering ``device_reads``."""
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        **device_reads,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_free_memory_of_each_gpu(monkeypatch):
    fake_nvml(monkeypatch, nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=(h + 1) * 1000))
    assert gpu.gpu_free_memory() == [1000, 2000]


def test_name_and_compute_capability_of_each_gpu(monkeypatch):
    fake_nvml(
        monkeypatch,
        nvmlDeviceGetName=lambda h: b"NVIDIA A10G" if h == 0 else "NVIDIA L4",
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 6) if h == 0 else (8, 9),
    )
    assert gpu.gpu_models() == [("NVIDIA A10G", "8.6"), ("NVIDIA L4", "8.9")]


def test_no_driver_or_no_nvml_means_no_gpus(monkeypatch):
    def no_driver() -> None:
        raise NVMLError("driver not loaded")

    fake = fake_nvml(monkeypatch, nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=1))
    fake.nvmlInit = no_driver
    assert gpu.gpu_free_memory() == []
    assert gpu.gpu_models() == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert gpu.gpu_free_memory() == []
