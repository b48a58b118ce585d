"""serve on a GPU with smtriton's Python-based `pytorch` and `onnxruntime` backends, the ones a Triton without
native backends runs (the nvidia-pytriton wheel's, as on a laptop or a GPU box set up by scripts/setup.sh):
KIND_GPU instances on CUDA, a multi-model endpoint's GPU memory as NVML sees it, and its 507.

Skipped (tests/gpu/conftest.py) without an NVIDIA GPU; each test also skips where the Triton serve finds
has the native backend (NVIDIA's image: tests/gpu/test_serve_gpu.py covers that one), and where the
framework cannot reach the GPU: a CUDA build of torch (`torch.cuda.is_available()`) for `pytorch`, ONNX
Runtime's CUDA provider (the onnxruntime-gpu package) for `onnxruntime`. Every process a test starts is
stopped with its children.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from smtriton.serve.host.gpu import each_gpu
from smtriton.serve.triton.installation import TritonNotFound, find_triton
from tests.gpu.encoder import Encoder
from tests.integration.harness import ServeProcess

pytestmark = pytest.mark.gpu

MIB = 1 << 20
# A table this large makes a model's GPU memory stand out from a CUDA context and whatever else is there.
BIG_ROWS = 1 << 16
BIG_WIDTH = 1024  # 256 MiB of FP32
TORCHSCRIPT = ("INPUT__0", "OUTPUT__0")


def _needs_python_based(backend: str) -> None:
    """Skip unless serve would run ``backend`` as smtriton's Python-based one, and its framework sees a GPU."""
    try:
        installation = find_triton()
    except TritonNotFound as exc:
        pytest.skip(str(exc))
    if backend in installation.native_backends():
        pytest.skip(f"{installation.binary} has a native {backend} backend: test_serve_gpu.py covers it")
    if backend == "pytorch":
        torch = pytest.importorskip("torch", reason="torch is not installed")
        if not torch.cuda.is_available():
            pytest.skip(f"torch {torch.__version__} is not a CUDA build, or sees no GPU")
    else:
        ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            pytest.skip(f"ONNX Runtime {ort.__version__} has no CUDA provider (install onnxruntime-gpu)")


def _gpu_memory() -> list[tuple[int, int, int]]:
    """(used, free, total) bytes of each GPU, through NVML as serve reads it."""

    def read(nvml, handle) -> tuple[int, int, int]:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.used), int(info.free), int(info.total)

    memory = each_gpu(read)
    if not memory:
        pytest.fail("nvidia-smi sees a GPU but NVML (nvidia-ml-py, which serve uses) does not")
    return memory


def _used() -> int:
    return sum(used for used, _, _ in _gpu_memory())


def _settles(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _start(tmp: Path, repository: Path | None, model: str | None, **kwargs) -> ServeProcess:
    server = ServeProcess(repository, model, tmp / "serve.log", **kwargs)
    try:
        server.wait_healthy(300)
    except BaseException:
        server.stop()
        raise
    return server


def _on_gpu(server: ServeProcess, model: str) -> bool:
    """Triton's log says the model's instance was created on a GPU (KIND_GPU given to the Python backend)."""
    pattern = rf"ModelInstanceInitialize: {re.escape(model)}\S* \(GPU device \d+\)"
    return re.search(pattern, server.log_text()) is not None


WRITERS = {
    "pytorch": (Encoder.write_torchscript, TORCHSCRIPT),
    "onnxruntime": (Encoder.write_onnx, ("ids", "hidden")),
}


@pytest.mark.parametrize("backend", ["pytorch", "onnxruntime"])
def test_a_kind_gpu_instance_runs_on_cuda(tmp_path, backend):
    """KIND_GPU on the Python-based backend: the model answers as computed here, Triton put its instance
    on a GPU, and the GPU holds its 256 MiB table (NVML's used memory grew by at least half of it)."""
    _needs_python_based(backend)
    write, tensors = WRITERS[backend]
    encoder = Encoder(BIG_ROWS, BIG_WIDTH)
    repo = tmp_path / "repo"
    write(encoder, repo / "enc")
    before = _used()
    server = _start(tmp_path, repo, "enc")
    try:
        encoder.check(server.url, "/invocations", tensors)
        assert _on_gpu(server, "enc"), server.log_tail()
        grown = _used() - before
        assert grown >= encoder.table.nbytes // 2, f"GPU memory used grew by {grown // MIB} MiB only"
    finally:
        assert server.stop() == 0
    assert _settles(lambda: _used() <= before + 64 * MIB), "stopping serve did not give the GPU memory back"


def test_multi_model_loads_on_the_pytorch_backend_take_gpu_memory_and_unloads_give_it_back(tmp_path):
    """Two TorchScript copies of a model with a 256 MiB table loaded through POST /models: each load takes
    GPU memory (NVML; each instance is a Python stub of its own, with its CUDA context), each answers, and
    DELETE gives the memory back while the other model keeps serving."""
    _needs_python_based("pytorch")
    encoder = Encoder(BIG_ROWS, BIG_WIDTH)
    root = tmp_path / "models"
    source = encoder.write_torchscript(tmp_path / "source" / "big")
    table = encoder.table.nbytes
    server = _start(tmp_path, None, None, args=["--multi-model", "--model-root", str(root)])
    try:
        used = [_used()]
        for name in ("big1", "big2"):
            url = root / name / "model"
            (url / "1").mkdir(parents=True)
            os.link(source / "1" / "model.pt", url / "1" / "model.pt")  # a copy in all but disk space
            (url / "config.pbtxt").write_text((source / "config.pbtxt").read_text())
            r = requests.post(f"{server.url}/models", json={"model_name": name, "url": str(url)}, timeout=300)
            assert r.status_code == 200, r.text
            encoder.check(server.url, f"/models/{name}/invoke", TORCHSCRIPT)
            assert _on_gpu(server, name), server.log_tail()
            used.append(_used())
        grown = [(b - a) // MIB for a, b in itertools.pairwise(used)]
        assert all(g >= table // 2 // MIB for g in grown), f"GPU memory used grew by {grown} MiB a load"
        loaded = used[-1]
        assert requests.delete(f"{server.url}/models/big1", timeout=300).status_code == 200
        assert _settles(lambda: loaded - _used() >= table // 2), (
            f"unloading gave back {(loaded - _used()) // MIB} MiB of GPU memory, the table alone is {table // MIB} MiB"
        )
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        encoder.check(server.url, "/models/big2/invoke", TORCHSCRIPT)
    finally:
        assert server.stop() == 0
    assert _settles(lambda: _used() <= used[0] + 64 * MIB), "stopping serve did not give the GPU memory back"


def test_a_pytorch_load_gets_507_when_no_gpu_has_the_reserve_free(tmp_path):
    """The reserve set above what any GPU has: the load of a KIND_GPU TorchScript model is refused with 507
    and the free memory NVML reads, nothing is loaded (no stub holds GPU memory), the endpoint stays
    healthy."""
    _needs_python_based("pytorch")
    memory = _gpu_memory()
    reserve = max(total for _, _, total in memory) + 1024 * MIB
    root = tmp_path / "models"
    Encoder().write_torchscript(root / "m" / "model")
    server = _start(
        tmp_path,
        None,
        None,
        args=["--multi-model", "--model-root", str(root)],
        env={"SMTRITON_GPU_MEMORY_RESERVE_BYTES": str(reserve)},
    )
    try:
        before = _used()
        r = requests.post(
            f"{server.url}/models", json={"model_name": "m", "url": str(root / "m" / "model")}, timeout=120
        )
        assert r.status_code == 507, r.text
        message = r.json()["error"]
        found = re.search(r"the most free on any GPU is (\d+) MiB", message)
        assert found, message
        free_now = max(free for _, free, _ in _gpu_memory()) // MIB
        assert abs(int(found.group(1)) - free_now) <= max(256, free_now // 20), (message, free_now)
        assert not _on_gpu(server, "m"), server.log_tail()
        assert _used() <= before + 64 * MIB
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert requests.get(f"{server.url}/models", timeout=5).json() == {"models": []}
    finally:
        assert server.stop() == 0
