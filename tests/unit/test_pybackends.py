"""Pure logic of the Python-based backends: config parsing, dims rules, batching, binding rules.

Triton's ``triton_python_backend_utils`` exists only inside the stub, so a small fake stands in for it;
the real thing is exercised by tests/integration/test_pybackends.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smtriton.serve.triton.pybackends import _common as common

# torch 2.13 deprecates torch.jit.script/load; the native pytorch backend still consumes TorchScript.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BACKENDS = Path(common.__file__).parent


def _load_backend(name: str) -> types.ModuleType:
    """Import ``<backend>/model.py`` under a private name (the directory names shadow real packages)."""
    spec = importlib.util.spec_from_file_location(f"_pybackend_{name}", BACKENDS / name / "model.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(config: dict[str, Any], **extra: str) -> dict[str, str]:
    return {
        "model_config": json.dumps(config),
        "model_name": config["name"],
        "model_version": "1",
        "model_repository": "/repo/" + config["name"],
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
        **extra,
    }


def _spec(max_batch_size: int = 8, **config: Any) -> common.ModelSpec:
    base = {
        "name": "m",
        "max_batch_size": max_batch_size,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [
            {"name": "Y", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "S", "data_type": "TYPE_FP32", "dims": [1]},
        ],
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
    }
    base.update(config)
    return common.ModelSpec.from_args(_args(base))


# --------------------------------------------------------------------------------------------------
# Config


def test_spec_reads_config_parameters_and_instance_count() -> None:
    spec = _spec(
        parameters={"intra_op_thread_count": {"string_value": "3"}, "FLAG": {"string_value": "True"}},
        default_model_filename="net.onnx",
        input=[{"name": "X", "data_type": "TYPE_INT64", "dims": [2, -1], "reshape": {"shape": [-1]}}],
    )
    assert spec.batching
    assert spec.instance_count == 2
    assert spec.inputs[0].dims == (2, -1)
    assert spec.inputs[0].model_dims == (-1,)
    assert spec.full_shape(spec.inputs[0]) == (-1, -1)
    assert spec.model_path("model.onnx") == Path("/repo/m/1/net.onnx")
    assert spec.int_param("intra_op_thread_count", default=1) == 3
    assert spec.int_param("missing", default=7) == 7
    assert spec.bool_param("FLAG", default=False) is True


def test_bad_parameter_values_fail_the_load_naming_the_key() -> None:
    spec = _spec(parameters={"n": {"string_value": "two"}, "b": {"string_value": "maybe"}})
    with pytest.raises(common.ModelLoadError, match="parameter 'n' must be an integer"):
        spec.int_param("n", default=1)
    with pytest.raises(common.ModelLoadError, match="parameter 'b' must be true or false"):
        spec.bool_param("b", default=True)


@pytest.mark.parametrize(("data_type", "why"), [("TYPE_STRING", "string tensors"), ("TYPE_BF16", "bfloat16")])
def test_unsupported_data_types_fail_the_load(data_type: str, why: str) -> None:
    spec = _spec(input=[{"name": "T", "data_type": data_type, "dims": [1]}])
    with pytest.raises(common.ModelLoadError, match=f"input 'T' has {data_type}; {why}"):
        common.check_data_types(spec, "onnxruntime")


def test_default_threads_divide_all_cores_but_one_among_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _spec().instance_count == 2
    monkeypatch.setattr(common, "cpu_count", lambda: 8)
    assert common.default_intra_op_threads(_spec()) == 3
    monkeypatch.setattr(common, "cpu_count", lambda: 2)
    assert common.default_intra_op_threads(_spec()) == 1
    monkeypatch.setattr(common, "cpu_count", lambda: 1)
    assert common.default_intra_op_threads(_spec()) == 1


@pytest.mark.parametrize(
    ("max_batch_size", "model_shape", "ok"),
    [
        (8, [None, 4], True),
        (8, ["batch", 4], True),
        (8, [None, None], True),
        (8, [2, 4], False),  # batching needs a dynamic first dimension
        (8, [None, 5], False),
        (8, [4], False),
        (0, [4], True),
        (0, [None, 4], False),
    ],
)
def test_dims_follow_the_native_onnxruntime_rule(max_batch_size: int, model_shape: list[Any], ok: bool) -> None:
    spec = _spec(max_batch_size)
    shape = [d if isinstance(d, int) else None for d in model_shape]
    assert (common.compare_dims(spec, spec.inputs[0], shape) is None) == ok


# --------------------------------------------------------------------------------------------------
# Execution, with a fake triton_python_backend_utils


class FakeTensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.tensor_name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class FakeError:
    def __init__(self, message: str) -> None:
        self.text = message


class FakeResponse:
    def __init__(self, output_tensors: list[FakeTensor], error: FakeError | None = None) -> None:
        self.outputs = {t.tensor_name: t.array for t in output_tensors}
        self.error = error


class FakeRequest:
    def __init__(self, inputs: dict[str, np.ndarray], requested: set[str]) -> None:
        self.inputs, self.requested = inputs, requested

    def requested_output_names(self) -> set[str]:
        return self.requested


@pytest.fixture
def pb(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = FakeTensor  # type: ignore[attr-defined]
    fake.TritonError = FakeError  # type: ignore[attr-defined]
    fake.InferenceResponse = FakeResponse  # type: ignore[attr-defined]

    def get_input(request: FakeRequest, name: str) -> FakeTensor | None:
        return FakeTensor(name, request.inputs[name]) if name in request.inputs else None

    fake.get_input_tensor_by_name = get_input  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    return fake


class Recorder:
    """A model: Y = 2X, S = row sums; records the batch sizes it was called with."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.calls: list[tuple[int, list[str]]] = []
        self.fail_on = fail_on

    def __call__(self, inputs: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        x = inputs["X"]
        self.calls.append((x.shape[0], wanted))
        if self.fail_on is not None and (x == self.fail_on).any():
            raise ValueError("bad value")
        return {"Y": x * 2, "S": x.sum(axis=1, keepdims=True)}


def _request(rows: int, value: float, requested: set[str] | None = None, width: int = 4) -> FakeRequest:
    return FakeRequest({"X": np.full((rows, width), value, np.float32)}, requested or {"Y", "S"})


def test_matching_requests_run_as_one_batch_and_get_their_own_rows(pb: types.ModuleType) -> None:
    run = Recorder()
    responses = common.execute([_request(1, 1.0), _request(2, 2.0), _request(1, 3.0)], _spec(), run)
    assert run.calls == [(4, ["Y", "S"])]
    assert [r.outputs["Y"][:, 0].tolist() for r in responses] == [[2.0], [4.0, 4.0], [6.0]]
    assert all(r.error is None for r in responses)


def test_requests_with_other_shapes_or_no_batching_run_separately(pb: types.ModuleType) -> None:
    run = Recorder()
    common.execute([_request(1, 1.0), _request(1, 1.0, width=5)], _spec(), run)
    assert [c[0] for c in run.calls] == [1, 1]
    run = Recorder()
    common.execute([_request(1, 1.0), _request(1, 1.0)], _spec(0), run)
    assert len(run.calls) == 2


def test_only_requested_outputs_are_computed_and_returned(pb: types.ModuleType) -> None:
    run = Recorder()
    responses = common.execute([_request(1, 1.0, {"S"}), _request(1, 2.0, {"S"})], _spec(), run)
    assert run.calls == [(2, ["S"])]
    assert [set(r.outputs) for r in responses] == [{"S"}, {"S"}]


def test_a_failing_batch_is_retried_so_only_the_bad_request_fails(pb: types.ModuleType) -> None:
    run = Recorder(fail_on=9.0)
    responses = common.execute([_request(1, 1.0), _request(1, 9.0), _request(1, 3.0)], _spec(), run)
    assert responses[0].error is None
    assert responses[2].error is None
    assert responses[1].error is not None
    assert "model 'm' failed: bad value" in responses[1].error.text
    assert responses[2].outputs["Y"][0, 0] == 6.0


def test_output_dtype_that_disagrees_with_the_config_is_an_error(pb: types.ModuleType) -> None:
    def run(inputs: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        return {name: inputs["X"].astype(np.float64)[:, :1] for name in wanted}

    (response,) = common.execute([_request(1, 1.0, {"S"})], _spec(), run)
    assert "configuration expects datatype TYPE_FP32 for output 'S', model provides TYPE_FP64" in response.error.text


def test_output_reshape_is_undone_to_the_config_dims(pb: types.ModuleType) -> None:
    spec = _spec(output=[{"name": "Y", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}}])

    def run(inputs: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        return {"Y": inputs["X"].reshape(-1, 2, 2)}

    a, b = common.execute([_request(1, 1.0, {"Y"}), _request(2, 2.0, {"Y"})], spec, run)
    assert a.outputs["Y"].shape == (1, 4)
    assert b.outputs["Y"].shape == (2, 4)


def test_split_rejects_outputs_without_the_batch_dimension() -> None:
    with pytest.raises(common.RequestError, match="first dimension should be the batch size 3"):
        common.split_outputs({"Y": np.zeros((2, 4))}, [1, 2])


# --------------------------------------------------------------------------------------------------
# Backend-specific rules


def test_tensorrt_stand_in_refuses_to_load_with_the_reason() -> None:
    trt = _load_backend("tensorrt")
    with pytest.raises(RuntimeError) as info:
        trt.TritonPythonModel().initialize(_args({"name": "plan_model"}))
    message = str(info.value)
    assert "a TensorRT plan needs an NVIDIA GPU and Triton's native tensorrt backend" in message
    assert "model 'plan_model' cannot be loaded here" in message


@pytest.fixture(scope="module")
def pt() -> types.ModuleType:
    pytest.importorskip("torch")
    return _load_backend("pytorch")


def _ts_spec(inputs: list[str], outputs: list[str]) -> common.ModelSpec:
    return _spec(
        input=[{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in inputs],
        output=[{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in outputs],
    )


@pytest.fixture(scope="module")
def two_arg_module(pt: types.ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import torch

    class M(torch.nn.Module):
        def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return image * mask

    path = tmp_path_factory.mktemp("ts") / "m.pt"
    torch.jit.script(M()).save(str(path))
    return torch.jit.load(str(path))


@pytest.mark.parametrize(
    ("names", "binding"),
    [
        (["mask", "image"], {"mask": 1, "image": 0}),  # forward() argument names win
        (["B__1", "A__0"], {"B__1": 1, "A__0": 0}),  # then <name>__<index>
        (["b", "a"], {"b": 0, "a": 1}),  # else config order
    ],
)
def test_torchscript_inputs_bind_like_the_native_backend(
    pt: types.ModuleType, two_arg_module: Any, names: list[str], binding: dict[str, int]
) -> None:
    assert pt._input_binding(_ts_spec(names, ["OUT"]), two_arg_module) == (False, binding)


def test_torchscript_input_count_mismatch_fails_the_load(pt: types.ModuleType, two_arg_module: Any) -> None:
    with pytest.raises(common.ModelLoadError, match="configuration expects 1 inputs, model provides 2"):
        pt._input_binding(_ts_spec(["image"], ["OUT"]), two_arg_module)


def test_torchscript_outputs_bind_by_index_suffix_else_config_order(pt: types.ModuleType) -> None:
    assert pt._output_binding(_ts_spec(["X"], ["OUTPUT__1", "OUTPUT__0"])) == {"OUTPUT__1": 1, "OUTPUT__0": 0}
    assert pt._output_binding(_ts_spec(["X"], ["logits", "OUTPUT__0"])) == {"logits": 0, "OUTPUT__0": 1}
    with pytest.raises(common.ModelLoadError, match="both name index 0"):
        pt._output_binding(_ts_spec(["X"], ["A__0", "B__0"]))


def test_torchscript_dict_input_model_runs_end_to_end(
    pt: types.ModuleType, pb: types.ModuleType, tmp_path: Path
) -> None:
    import torch

    class M(torch.nn.Module):
        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return batch["a"] - batch["b"]

    (tmp_path / "1").mkdir()
    torch.jit.script(M()).save(str(tmp_path / "1" / "model.pt"))
    config = {
        "name": "dict_model",
        "max_batch_size": 4,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [2]} for n in ("b", "a")],
        "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [2]}],
        "parameters": {"INTRA_OP_THREAD_COUNT": {"string_value": "1"}},
    }
    model = pt.TritonPythonModel()
    threads = torch.get_num_threads()
    try:
        model.initialize(_args(config, model_repository=str(tmp_path)))
    finally:
        torch.set_num_threads(threads)  # initialize sets process-wide threads; keep the test process as it was
    a, b = np.array([[5.0, 7.0]], np.float32), np.array([[1.0, 2.0]], np.float32)
    (response,) = model.execute([FakeRequest({"a": a, "b": b}, {"OUTPUT__0"})])
    assert response.error is None
    np.testing.assert_array_equal(response.outputs["OUTPUT__0"], [[4.0, 5.0]])
