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

import pytest
import requests

from smtriton.serve.triton.installation import TritonNotFound, find_triton
from tests.gpu.encoder import Encoder
from tests.gpu.serving import BIG_ROWS, BIG_WIDTH, MIB, gpu_memory, gpu_used, on_gpu, settles, start

pytestmark = pytest.mark.gpu

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
    before = gpu_used()
    server = start(tmp_path, repo, "enc")
    try:
        encoder.check(server.url, "/invocations", tensors)
        assert on_gpu(server, "enc"), server.log_tail()
        grown = gpu_used() - before
        assert grown >= encoder.table.nbytes // 2, f"GPU memory used grew by {grown // MIB} MiB only"
    finally:
        assert server.stop() == 0
    assert settles(lambda: gpu_used() <= before + 64 * MIB), "stopping serve did not give the GPU memory back"


def test_multi_model_loads_on_the_pytorch_backend_take_gpu_memory_and_unloads_give_it_back(tmp_path):
    """Two TorchScript copies of a model with a 256 MiB table loaded through POST /models: each load takes
    GPU memory (NVML; each instance is a Python stub of its own, with its CUDA context), each answers, and
    DELETE gives the memory back while the other model keeps serving."""
    _needs_python_based("pytorch")
    encoder = Encoder(BIG_ROWS, BIG_WIDTH)
    root = tmp_path / "models"
    source = encoder.write_torchscript(tmp_path / "source" / "big")
    table = encoder.table.nbytes
    server = start(tmp_path, None, None, args=["--multi-model", "--model-root", str(root)])
    try:
        used = [gpu_used()]
        for name in ("big1", "big2"):
            url = root / name / "model"
            (url / "1").mkdir(parents=True)
            os.link(source / "1" / "model.pt", url / "1" / "model.pt")  # a copy in all but disk space
            (url / "config.pbtxt").write_text((source / "config.pbtxt").read_text())
            r = requests.post(f"{server.url}/models", json={"model_name": name, "url": str(url)}, timeout=300)
            assert r.status_code == 200, r.text
            encoder.check(server.url, f"/models/{name}/invoke", TORCHSCRIPT)
            assert on_gpu(server, name), server.log_tail()
            used.append(gpu_used())
        grown = [(b - a) // MIB for a, b in itertools.pairwise(used)]
        assert all(g >= table // 2 // MIB for g in grown), f"GPU memory used grew by {grown} MiB a load"
        loaded = used[-1]
        assert requests.delete(f"{server.url}/models/big1", timeout=300).status_code == 200
        assert settles(lambda: loaded - gpu_used() >= table // 2), (
            f"unloading gave back {(loaded - gpu_used()) // MIB} MiB of GPU memory, the table is {table // MIB} MiB"
        )
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        encoder.check(server.url, "/models/big2/invoke", TORCHSCRIPT)
    finally:
        assert server.stop() == 0
    assert settles(lambda: gpu_used() <= used[0] + 64 * MIB), "stopping serve did not give the GPU memory back"


def test_a_pytorch_load_gets_507_when_no_gpu_has_the_reserve_free(tmp_path):
    """The reserve set above what any GPU has: the load of a KIND_GPU TorchScript model is refused with 507
    and the free memory NVML reads, nothing is loaded (no stub holds GPU memory), the endpoint stays
    healthy."""
    _needs_python_based("pytorch")
    memory = gpu_memory()
    reserve = max(total for _, _, total in memory) + 1024 * MIB
    root = tmp_path / "models"
    Encoder().write_torchscript(root / "m" / "model")
    server = start(
        tmp_path,
        None,
        None,
        args=["--multi-model", "--model-root", str(root)],
        env={"SMTRITON_GPU_MEMORY_RESERVE_BYTES": str(reserve)},
    )
    try:
        before = gpu_used()
        r = requests.post(
            f"{server.url}/models", json={"model_name": "m", "url": str(root / "m" / "model")}, timeout=120
        )
        assert r.status_code == 507, r.text
        message = r.json()["error"]
        found = re.search(r"the most free on any GPU is (\d+) MiB", message)
        assert found, message
        free_now = max(free for _, free, _ in gpu_memory()) // MIB
        assert abs(int(found.group(1)) - free_now) <= max(256, free_now // 20), (message, free_now)
        assert not on_gpu(server, "m"), server.log_tail()
        assert gpu_used() <= before + 64 * MIB
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert requests.get(f"{server.url}/models", timeout=5).json() == {"models": []}
    finally:
        assert server.stop() == 0
