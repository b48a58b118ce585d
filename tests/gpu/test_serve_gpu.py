"""serve on a GPU with Triton's native backends: ONNX Runtime on CUDA, TorchScript on CUDA, a multi-model
endpoint's GPU memory as NVML sees it and its 507, and a TensorRT plan built in this image.

Skipped (tests/gpu/conftest.py) without an NVIDIA GPU; each test also skips where the Triton serve finds
has no native backend for its model (anywhere but a Triton image such as NVIDIA's). Run them inside the
serving image on a GPU host: scripts/gpu-proof.sh does, and gives the plan test the repository it converted.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import requests

from smtriton.serve.triton.installation import TritonNotFound, find_triton
from tests.gpu.encoder import Encoder
from tests.gpu.serving import BIG_ROWS, BIG_WIDTH, MIB, gpu_memory, gpu_used, on_gpu, settles, start

pytestmark = pytest.mark.gpu


def _needs_native(backend: str) -> None:
    try:
        installation = find_triton()
    except TritonNotFound as exc:
        pytest.skip(str(exc))
    if backend not in installation.native_backends():
        pytest.skip(f"{installation.binary} has no native {backend} backend (NVIDIA's Triton image has)")


def _infer(url: str, path: str, inputs: dict[str, np.ndarray], datatypes: dict[str, str]) -> dict[str, np.ndarray]:
    body = {
        "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": datatypes[name], "data": a.flatten().tolist()}
            for name, a in inputs.items()
        ]
    }
    r = requests.post(f"{url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text[:1000]
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}


def test_onnx_runtime_serves_on_cuda(tmp_path):
    _needs_native("onnxruntime")
    encoder = Encoder()
    repo = tmp_path / "repo"
    encoder.write_onnx(repo / "enc_ort")
    server = start(tmp_path, repo, "enc_ort")
    try:
        encoder.check(server.url, "/invocations")
        assert on_gpu(server, "enc_ort"), server.log_tail()
    finally:
        assert server.stop() == 0


def test_torchscript_serves_on_cuda(tmp_path):
    _needs_native("pytorch")
    torch = pytest.importorskip("torch", reason="torch makes the TorchScript model (scripts/gpu-proof.sh installs it)")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(3, 8)
    model_dir = tmp_path / "repo" / "mlp_pt"
    (model_dir / "1").mkdir(parents=True)
    with torch.no_grad():
        torch.jit.freeze(torch.jit.trace(module, x)).save(str(model_dir / "1" / "model.pt"))
        want = module(x).numpy()
    (model_dir / "config.pbtxt").write_text(
        'name: "mlp_pt"\nplatform: "pytorch_libtorch"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT__0", data_type: TYPE_FP32, dims: [-1, 8] }]\n'
        'output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [-1, 4] }]\n'
        "instance_group [{ kind: KIND_GPU, count: 1 }]\n"
    )
    server = start(tmp_path, model_dir.parent, "mlp_pt")
    try:
        got = _infer(server.url, "/invocations", {"INPUT__0": x.numpy()}, {"INPUT__0": "FP32"})["OUTPUT__0"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
        assert on_gpu(server, "mlp_pt"), server.log_tail()
    finally:
        assert server.stop() == 0


def test_multi_model_loads_take_gpu_memory_and_unloads_give_it_back(tmp_path):
    """Two copies of a model with a 256 MiB table loaded through POST /models on a GPU instance: each
    load takes GPU memory (NVML), each answers, and DELETE gives the memory back."""
    _needs_native("onnxruntime")
    if not gpu_memory():
        pytest.fail("nvidia-smi sees a GPU but NVML (nvidia-ml-py, which serve uses) does not")
    encoder = Encoder(BIG_ROWS, BIG_WIDTH)
    root = tmp_path / "models"
    source = encoder.write_onnx(tmp_path / "source" / "big")
    table = encoder.table.nbytes
    server = start(tmp_path, None, None, args=["--multi-model", "--model-root", str(root)])
    try:
        used = [gpu_used()]
        for name in ("big1", "big2"):
            url = root / name / "model"
            url.mkdir(parents=True)
            (url / "1").mkdir()
            os.link(source / "1" / "model.onnx", url / "1" / "model.onnx")  # a copy in all but disk space
            (url / "config.pbtxt").write_text((source / "config.pbtxt").read_text())
            r = requests.post(f"{server.url}/models", json={"model_name": name, "url": str(url)}, timeout=300)
            assert r.status_code == 200, r.text
            encoder.check(server.url, f"/models/{name}/invoke")
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
        encoder.check(server.url, "/models/big2/invoke")
    finally:
        assert server.stop() == 0
    assert settles(lambda: gpu_used() <= used[0] + 64 * MIB), "stopping serve did not give the GPU memory back"


def test_a_load_gets_507_when_no_gpu_has_the_reserve_free(tmp_path):
    """The reserve set above what any GPU has: the load is refused with 507 and the free memory NVML reads,
    nothing is loaded, and the endpoint stays healthy."""
    _needs_native("onnxruntime")
    memory = gpu_memory()
    reserve = max(total for _, _, total in memory) + 1024 * MIB
    root = tmp_path / "models"
    Encoder().write_onnx(root / "m" / "model")
    server = start(
        tmp_path,
        None,
        None,
        args=["--multi-model", "--model-root", str(root)],
        env={"SMTRITON_GPU_MEMORY_RESERVE_BYTES": str(reserve)},
    )
    try:
        r = requests.post(
            f"{server.url}/models", json={"model_name": "m", "url": str(root / "m" / "model")}, timeout=120
        )
        assert r.status_code == 507, r.text
        message = r.json()["error"]
        found = re.search(r"the most free on any GPU is (\d+) MiB", message)
        assert found, message
        free_now = max(free for _, free, _ in gpu_memory()) // MIB
        assert abs(int(found.group(1)) - free_now) <= max(256, free_now // 20), (message, free_now)
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert requests.get(f"{server.url}/models", timeout=5).json() == {"models": []}
    finally:
        assert server.stop() == 0


PLAN_REPOSITORY = os.environ.get("SMTRITON_GPU_PLAN_REPOSITORY", "")


@pytest.mark.skipif(
    not PLAN_REPOSITORY, reason="no converted repository: scripts/gpu-proof.sh sets SMTRITON_GPU_PLAN_REPOSITORY"
)
def test_the_plan_converted_in_this_image_is_served_and_matches_onnx_runtime(tmp_path):
    """The repository scripts/gpu-proof.sh converted in this image (the demo text encoder's ONNX model and its
    TensorRT plan): serve checks the plan's sidecar against this host, Triton runs it on the GPU, and its
    answer to the README's request matches ONNX Runtime on the ONNX model within the plan's precision."""
    _needs_native("tensorrt")
    ort = pytest.importorskip("onnxruntime")
    from smtriton import dtypes, model_config
    from smtriton.convert import tensorrt_build
    from smtriton.convert.tensorrt_profiles import read_sidecar

    repository = Path(PLAN_REPOSITORY)
    plans = sorted(repository.glob("*/[0-9]*/model.plan"))
    assert plans, f"no TensorRT plan under {repository}"
    plan_dir = plans[0].parent.parent
    sidecar = read_sidecar(plans[0])
    assert sidecar is not None
    config = model_config.read(plan_dir)
    datatypes = {i.name: model_config.data_type_name(i.data_type).removeprefix("TYPE_") for i in config.input}
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    request = re.search(r"-d '(\{.*?\})'", readme, re.S)
    assert request is not None, "the README's curl request"
    given = {i["name"]: np.array(i["data"]).reshape(i["shape"]) for i in json.loads(request.group(1))["inputs"]}
    server = start(tmp_path, repository, plan_dir.name)
    try:
        inputs = {name: given[name].astype(dtypes.numpy_dtype(datatypes[name])) for name in datatypes}
        got = _infer(server.url, "/invocations", inputs, datatypes)
        assert on_gpu(server, plan_dir.name), server.log_tail()
    finally:
        assert server.stop() == 0
    onnx_files = sorted(p for p in repository.glob("*/[0-9]*/model.onnx"))
    assert onnx_files, f"no ONNX model under {repository} to compare with"
    session = ort.InferenceSession(str(onnx_files[0]), providers=["CPUExecutionProvider"])
    onnx_types = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}
    feeds = {i.name: given[i.name].astype(onnx_types[i.type]) for i in session.get_inputs()}
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    atol, rtol = tensorrt_build.TOLERANCES[sidecar.precision]
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], atol=atol, rtol=rtol, err_msg=name)
