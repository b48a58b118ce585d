"""The Python-based backends (serve/triton/pybackends) under a real Triton 2.51, as the project uses them.

Tiny seeded torch models are exported to ONNX and TorchScript, served through configs that name the
native platforms (``onnxruntime_onnx``, ``pytorch_libtorch``, ``tensorrt_plan``), and compared with
torch eager outputs over HTTP.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [
    pytest.mark.integration,
    # torch 2.13 deprecates the TorchScript-based ONNX exporter and torch.jit.script; both still work and
    # are what the native backends consume.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

torch = pytest.importorskip("torch")
requests = pytest.importorskip("requests")
httpclient = pytest.importorskip("tritonclient.http")
pytest.importorskip("onnxruntime")

import smtriton.serve.triton.pybackends as pybackends  # noqa: E402
from smtriton.serve.settings import Settings  # noqa: E402
from smtriton.serve.triton.backends import assemble_backends  # noqa: E402
from smtriton.serve.triton.installation import TritonNotFound, find_triton  # noqa: E402
from smtriton.serve.triton.process import Ports, build_command  # noqa: E402
from tests.integration.harness import (  # noqa: E402
    ServeProcess,
    free_port,
)

# --------------------------------------------------------------------------------------------------
# Models


class TwoInTwoOut(torch.nn.Module):
    """FP32 features + INT64 token ids -> FP32 scores, INT64 doubled ids."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.embed = torch.nn.Embedding(10, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x) + self.embed(ids).sum(1), ids * 2


class Indexed(torch.nn.Module):
    """Three outputs of three dtypes, for INPUT__i / OUTPUT__i binding."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x * mask.to(x.dtype), x.sum(1, keepdim=True).half(), x > 0


class Named(torch.nn.Module):
    """Arguments bound by name: the config lists them in the other order."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)

    def forward(self, tokens: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embed(tokens).mean(1) * scale, (tokens > 7).sum(1, keepdim=True)


class Broadcast(torch.nn.Module):
    """A + B, both of any shape: ONNX Runtime checks at run time that the two broadcast."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


IO = list[tuple[str, str, list[int]]]
Writer = Callable[[Path], Any]
ONE_INSTANCE = "instance_group [ { kind: KIND_CPU count: 1 } ]"
TWO_IN: IO = [("X", "TYPE_FP32", [4]), ("IDS", "TYPE_INT64", [5])]
TWO_OUT: IO = [("Y", "TYPE_FP32", [3]), ("Z", "TYPE_INT64", [5])]


def _config(name: str, platform: str, inputs: IO, outputs: IO, max_batch_size: int = 0, extra: str = "") -> str:
    def io(entries: IO) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in entries)

    return (
        f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {io(inputs)} ]\noutput [ {io(outputs)} ]\n{extra}\n"
    )


def _write(repo: Path, name: str, config: str, files: dict[str, Writer]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    for rel, writer in files.items():
        writer(repo / name / "1" / rel)


def _add(
    repo: Path, name: str, platform: str, io: tuple[IO, IO], file: tuple[str, Writer], mbs: int, extra: str
) -> None:
    _write(repo, name, _config(name, platform, io[0], io[1], mbs, extra), {file[0]: file[1]})


def _export_onnx(
    module: torch.nn.Module, args: tuple[Any, ...], names: tuple[list[str], list[str]], dynamic: bool
) -> Writer:
    def write(path: Path) -> None:
        axes = {n: {0: "batch"} for n in names[0] + names[1]} if dynamic else None
        torch.onnx.export(
            module, args, str(path), dynamo=False, input_names=names[0], output_names=names[1], dynamic_axes=axes
        )

    return write


def _script(module: torch.nn.Module) -> Writer:
    return lambda path: torch.jit.script(module).save(str(path))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    repo = tmp_path_factory.mktemp("repo")
    two, named = TwoInTwoOut().eval(), Named().eval()
    x, ids = torch.randn(2, 4), torch.randint(0, 10, (2, 5))
    onnx = ("model.onnx", _export_onnx(two, (x, ids), (["X", "IDS"], ["Y", "Z"]), dynamic=True))
    batcher = "dynamic_batching { max_queue_delay_microseconds: 50000 }"
    _add(repo, "onnx_batched", "onnxruntime_onnx", (TWO_IN, TWO_OUT), onnx, 8, batcher)

    # max_batch_size 0: the config gives the full shape; a custom file name that is a model.onnx/ directory.
    fixed = _export_onnx(two, (x, ids), (["X", "IDS"], ["Y", "Z"]), dynamic=False)
    fixed_io = (
        [("X", "TYPE_FP32", [2, 4]), ("IDS", "TYPE_INT64", [2, 5])],
        [("Y", "TYPE_FP32", [2, 3]), ("Z", "TYPE_INT64", [2, 5])],
    )
    in_dir = ("net.onnx", lambda p: (p.mkdir(), fixed(p / "model.onnx")))
    _add(
        repo,
        "onnx_fixed",
        "onnxruntime_onnx",
        fixed_io,
        in_dir,
        0,
        f'default_model_filename: "net.onnx"\n{ONE_INSTANCE}',
    )

    indexed_io = (
        [("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_BOOL", [4])],
        # listed out of order on purpose: the index in the name decides
        [("OUTPUT__2", "TYPE_BOOL", [4]), ("OUTPUT__0", "TYPE_FP32", [4]), ("OUTPUT__1", "TYPE_FP16", [1])],
    )
    extra = f"dynamic_batching {{ max_queue_delay_microseconds: 1000 }}\n{ONE_INSTANCE}"
    _add(repo, "ts_indexed", "pytorch_libtorch", indexed_io, ("model.pt", _script(Indexed())), 4, extra)
    named_io = (
        [("scale", "TYPE_FP32", [1]), ("tokens", "TYPE_INT64", [6])],  # forward(tokens, scale): bound by name
        [("embedding", "TYPE_FP32", [4]), ("count", "TYPE_INT64", [1])],
    )
    _add(repo, "ts_named", "pytorch_libtorch", named_io, ("model.pt", _script(named)), 4, ONE_INSTANCE)

    def broadcast(path: Path) -> None:
        axes = {"A": {0: "a0", 1: "a1"}, "B": {0: "b0", 1: "b1"}, "C": {0: "c0", 1: "c1"}}
        ones = torch.ones(2, 3)
        torch.onnx.export(
            Broadcast(),
            (ones, ones),
            str(path),
            dynamo=False,
            input_names=["A", "B"],
            output_names=["C"],
            dynamic_axes=axes,
        )

    any_2d: IO = [("A", "TYPE_FP32", [-1, -1]), ("B", "TYPE_FP32", [-1, -1])]
    broadcast_io = (any_2d, [("C", "TYPE_FP32", [-1, -1])])
    _add(repo, "onnx_broadcast", "onnxruntime_onnx", broadcast_io, ("model.onnx", broadcast), 0, ONE_INSTANCE)

    # Models that must fail to load (never loaded at start-up).
    bad_dtype = ([("X", "TYPE_FP64", [4]), ("IDS", "TYPE_INT64", [5])], TWO_OUT)
    _add(repo, "onnx_bad_dtype", "onnxruntime_onnx", bad_dtype, onnx, 8, ONE_INSTANCE)
    bad_name = (TWO_IN, [("Y", "TYPE_FP32", [3]), ("SCORES", "TYPE_INT64", [5])])
    _add(repo, "onnx_bad_name", "onnxruntime_onnx", bad_name, onnx, 8, ONE_INSTANCE)
    _add(repo, "onnx_bad_rank", "onnxruntime_onnx", (TWO_IN, TWO_OUT), onnx, 0, ONE_INSTANCE)
    one_in = ([("INPUT__0", "TYPE_FP32", [4])], [("OUTPUT__0", "TYPE_FP32", [4])])
    _add(repo, "ts_bad_count", "pytorch_libtorch", one_in, ("model.pt", _script(Indexed())), 4, ONE_INSTANCE)
    plan = ("model.plan", lambda p: p.write_bytes(b"not a plan"))
    _add(repo, "trt", "tensorrt_plan", ([("X", "TYPE_FP32", [4])], [("Y", "TYPE_FP32", [4])]), plan, 8, "")
    return {"repo": repo, "two": two, "named": named}


# --------------------------------------------------------------------------------------------------
# Server


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: Triton and its stubs
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def triton_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Triton's working directory: the backend directory and ``triton.log``."""
    return tmp_path_factory.mktemp("triton")


@pytest.fixture(scope="module")
def server(models: dict[str, Any], triton_root: Path) -> Iterator[str]:
    """tritonserver as serve starts it: the same binary, backend directory, environment and argv."""
    explicit = os.environ.get("TRITONSERVER")
    try:
        installation = find_triton(Path(explicit) if explicit else None)
    except TritonNotFound as exc:
        pytest.skip(str(exc))
    root = triton_root
    backends = assemble_backends(installation, root / "backends")
    if backends == installation.backends:
        pytest.skip(f"{installation.binary} runs every backend natively: the Python-based ones are not used")
    # The stubs' interpreter is isolated (it ignores PYTHONPATH) and puts its working directory first on
    # sys.path: a link there makes the stand-ins import this checkout's smtriton, the code under test,
    # rather than whichever copy is installed.
    (root / "smtriton").symlink_to(Path(pybackends.__file__).parents[3], target_is_directory=True)
    port = free_port()
    loaded = ("onnx_batched", "onnx_fixed", "onnx_broadcast", "ts_indexed", "ts_named")
    argv = [
        *build_command(installation, Settings.from_env({}), models["repo"], backends, Ports(http=port)),
        *(f"--load-model={m}" for m in loaded),
    ]
    env = {**os.environ, **installation.env}
    log = (root / "triton.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    url = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tritonserver exited {proc.returncode}:\n{(root / 'triton.log').read_text()[-4000:]}")
            try:
                if requests.get(f"http://{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tritonserver not ready:\n{(root / 'triton.log').read_text()[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        _stop(proc)
        log.close()


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[Any]:
    c = httpclient.InferenceServerClient(server, concurrency=16, network_timeout=60)
    yield c
    c.close()


def _infer(client: Any, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None) -> Any:
    tensors, wanted = _request(inputs, outputs)
    return client.infer(model, tensors, outputs=wanted)


def _infer_concurrently(client: Any, model: str, many: list[dict[str, np.ndarray]]) -> list[Any]:
    """All requests in flight at once (tritonclient's gevent pool; its client is not thread-safe)."""
    pending = [client.async_infer(model, _request(inputs, None)[0]) for inputs in many]
    return [p.get_result() for p in pending]


def _request(inputs: dict[str, np.ndarray], outputs: list[str] | None) -> tuple[list[Any], list[Any] | None]:
    tensors = []
    for name, arr in inputs.items():
        t = httpclient.InferInput(name, list(arr.shape), _triton_type(arr.dtype))
        t.set_data_from_numpy(arr, binary_data=True)
        tensors.append(t)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs] if outputs else None
    return tensors, wanted


def _triton_type(dtype: np.dtype[Any]) -> str:
    return {"float32": "FP32", "float16": "FP16", "int64": "INT64", "bool": "BOOL"}[np.dtype(dtype).name]


def _post_infer(server: str, model: str, inputs: dict[str, np.ndarray], path: str | None = None) -> requests.Response:
    """A JSON inference request straight to Triton (or to ``path``), for the status and body of a failure."""
    tensors = [
        {"name": n, "shape": list(a.shape), "datatype": _triton_type(a.dtype), "data": a.ravel().tolist()}
        for n, a in inputs.items()
    ]
    url = f"http://{server}{path or f'/v2/models/{model}/infer'}"
    return requests.post(url, json={"inputs": tensors}, timeout=60)


# An absolute path of a file (POSIX or Windows), as it would appear in a traceback.
ABSOLUTE_FILE = re.compile(r"(?<![\w./])/(?:[^\s/:\"'()]+/)+[^\s/:\"'()]+\.\w+|[A-Za-z]:\\")


def _load(server: str, model: str) -> requests.Response:
    return requests.post(f"http://{server}/v2/repository/models/{model}/load", timeout=60)


# --------------------------------------------------------------------------------------------------
# Tests


def test_onnx_batched_model_matches_torch_eager(client: Any, models: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4), dtype=np.float32)
    ids = rng.integers(0, 10, (3, 5), dtype=np.int64)
    result = _infer(client, "onnx_batched", {"X": x, "IDS": ids})
    want_y, want_z = models["two"](torch.from_numpy(x), torch.from_numpy(ids))
    np.testing.assert_allclose(result.as_numpy("Y"), want_y.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert result.as_numpy("Z").dtype == np.int64
    np.testing.assert_array_equal(result.as_numpy("Z"), want_z.numpy())


def test_onnx_returns_only_the_requested_output(client: Any) -> None:
    x, ids = np.ones((1, 4), np.float32), np.zeros((1, 5), np.int64)
    result = _infer(client, "onnx_batched", {"X": x, "IDS": ids}, outputs=["Z"])
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["Z"]


def test_onnx_full_shape_model_from_custom_file_in_directory(client: Any, models: dict[str, Any]) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4), dtype=np.float32)
    ids = rng.integers(0, 10, (2, 5), dtype=np.int64)
    result = _infer(client, "onnx_fixed", {"X": x, "IDS": ids})
    want_y, _ = models["two"](torch.from_numpy(x), torch.from_numpy(ids))
    assert result.as_numpy("Y").shape == (2, 3)
    np.testing.assert_allclose(result.as_numpy("Y"), want_y.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_concurrent_requests_are_batched_and_each_gets_its_own_result(
    client: Any, server: str, models: dict[str, Any]
) -> None:
    stats_url = f"http://{server}/v2/models/onnx_batched/stats"
    before = requests.get(stats_url, timeout=5).json()["model_stats"][0]
    rng = np.random.default_rng(3)
    batches = [int(b) for b in rng.integers(1, 3, 16)]
    xs = [rng.standard_normal((b, 4), dtype=np.float32) for b in batches]
    idss = [rng.integers(0, 10, (b, 5), dtype=np.int64) for b in batches]
    results = _infer_concurrently(client, "onnx_batched", [{"X": x, "IDS": i} for x, i in zip(xs, idss, strict=True)])
    for x, ids, result in zip(xs, idss, results, strict=True):
        want_y, want_z = models["two"](torch.from_numpy(x), torch.from_numpy(ids))
        np.testing.assert_allclose(result.as_numpy("Y"), want_y.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("Z"), want_z.numpy())
    after = requests.get(stats_url, timeout=5).json()["model_stats"][0]
    requests_served = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests_served == sum(batches)
    assert executions < len(batches), "the dynamic batcher should have merged some requests"


def test_torchscript_indexed_names_bind_by_index(client: Any) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4), dtype=np.float32)
    mask = rng.integers(0, 2, (2, 4)).astype(bool)
    result = _infer(client, "ts_indexed", {"INPUT__0": x, "INPUT__1": mask})
    w0, w1, w2 = Indexed()(torch.from_numpy(x), torch.from_numpy(mask))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), w0.numpy())
    assert result.as_numpy("OUTPUT__1").dtype == np.float16
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), w1.numpy())
    assert result.as_numpy("OUTPUT__2").dtype == np.bool_
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__2"), w2.numpy())


def test_torchscript_forward_argument_names_bind_by_name(client: Any, models: dict[str, Any]) -> None:
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 16, (3, 6), dtype=np.int64)
    scale = rng.standard_normal((3, 1), dtype=np.float32)
    result = _infer(client, "ts_named", {"scale": scale, "tokens": tokens}, outputs=["count", "embedding"])
    w_emb, w_count = models["named"](torch.from_numpy(tokens), torch.from_numpy(scale))
    np.testing.assert_allclose(result.as_numpy("embedding"), w_emb.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("count"), w_count.numpy())


def test_torchscript_concurrent_requests_keep_their_own_results(client: Any) -> None:
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 4), dtype=np.float32) for _ in range(12)]
    mask = np.ones((1, 4), bool)
    results = _infer_concurrently(client, "ts_indexed", [{"INPUT__0": x, "INPUT__1": mask} for x in xs])
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x)


def test_onnx_token_id_out_of_range_is_a_500_in_the_native_wording_and_the_model_keeps_serving(
    client: Any, server: str
) -> None:
    """The native onnxruntime backend reports every ONNX Runtime status as INTERNAL, "onnx runtime error
    <code>: <message>", INVALID_ARGUMENT included: Triton answers 500 (docs/contract.md §2.6)."""
    ids_out_of_range = np.full((1, 5), 99, np.int64)  # the embedding has 10 rows
    response = _post_infer(server, "onnx_batched", {"X": np.ones((1, 4), np.float32), "IDS": ids_out_of_range})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error.startswith("onnx runtime error 2: Non-zero status code returned while running Gather node.")
    assert "indices element out of data bounds, idx=99 must be within the inclusive range [-10,9]" in error
    ok = _infer(client, "onnx_batched", {"X": np.ones((1, 4), np.float32), "IDS": np.zeros((1, 5), np.int64)})
    assert ok.as_numpy("Y").shape == (1, 3)


def test_onnx_inputs_that_cannot_broadcast_are_a_500_without_onnx_runtimes_source_paths(server: str) -> None:
    a, b = np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)
    response = _post_infer(server, "onnx_broadcast", {"A": a, "B": b})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error.startswith("onnx runtime error 1: Non-zero status code returned while running Add node.")
    assert "Attempting to broadcast an axis by a dimension other than 1. 3 by 4" in error
    assert ABSOLUTE_FILE.search(error) is None, error
    ok = _post_infer(server, "onnx_broadcast", {"A": a, "B": np.ones((1, 3), np.float32)})
    assert ok.status_code == 200
    assert ok.json()["outputs"][0]["data"] == [2.0] * 6


def test_torchscript_index_error_is_a_500_without_the_traceback_which_goes_to_the_log(
    client: Any, server: str, triton_root: Path
) -> None:
    """Native: INTERNAL, "PyTorch execute failure: <what>". The TorchScript traceback names the files of
    the machine that scripted the model (here this file); it goes to Triton's log, not to the client."""
    tokens = np.full((1, 6), 99, np.int64)  # the embedding has 16 rows
    response = _post_infer(server, "ts_named", {"scale": np.ones((1, 1), np.float32), "tokens": tokens})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error == "PyTorch execute failure: RuntimeError: index out of range in self"
    assert ABSOLUTE_FILE.search(response.text) is None
    assert "code/__torch__" not in response.text
    ok = _infer(client, "ts_named", {"scale": np.ones((1, 1), np.float32), "tokens": np.zeros((1, 6), np.int64)})
    assert ok.as_numpy("embedding").shape == (1, 4)
    log = triton_root / "triton.log"
    deadline = time.monotonic() + 10
    while "Traceback of TorchScript" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    text = log.read_text()
    assert "model 'ts_named', version 1: request failed:" in text
    assert __file__ in text


@pytest.mark.parametrize(
    ("model", "fragments"),
    [
        ("onnx_bad_dtype", ["configuration expects datatype TYPE_FP64 for input 'X'", "model provides TYPE_FP32"]),
        ("onnx_bad_name", ["unexpected inference output 'SCORES'", "allowed outputs are: Y, Z"]),
        ("onnx_bad_rank", ["tensor 'X'", "the model expects 2 dimensions"]),
        ("ts_bad_count", ["configuration expects 1 inputs, model provides 2"]),
    ],
)
def test_config_that_disagrees_with_the_model_fails_the_load_with_a_clear_message(
    server: str, model: str, fragments: list[str]
) -> None:
    response = _load(server, model)
    assert response.status_code == 400
    error = response.json()["error"]
    for fragment in fragments:
        assert fragment in error


def test_tensorrt_plan_fails_to_load_explaining_why(server: str) -> None:
    response = _load(server, "trt")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "a TensorRT plan needs an NVIDIA GPU and Triton's native tensorrt backend" in error
    assert "model 'trt' cannot be loaded here" in error


def test_through_serve_onnx_runtime_refusing_the_data_is_400_and_the_model_keeps_serving(
    models: dict[str, Any], tmp_path: Path
) -> None:
    """The edge maps the backend's 500 for bad data (INVALID_ARGUMENT, a failed broadcast) to 400."""
    repository = tmp_path / "models"
    shutil.copytree(models["repo"] / "onnx_batched", repository / "onnx_batched")
    server = ServeProcess(repository, "onnx_batched", tmp_path / "serve.log")
    try:
        server.wait_healthy()
        body = {"X": np.ones((1, 4), np.float32), "IDS": np.full((1, 5), 99, np.int64)}
        address = server.url.removeprefix("http://")
        response = _post_infer(address, "", body, path="/invocations")
        assert response.status_code == 400, response.text
        assert response.json()["error"].startswith("onnx runtime error 2: ")
        body["IDS"] = np.zeros((1, 5), np.int64)
        assert _post_infer(address, "", body, path="/invocations").status_code == 200
    finally:
        server.stop()
