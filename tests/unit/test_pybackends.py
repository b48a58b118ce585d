"""Pure logic of the Python-based backends: config parsing, dims rules, batching, binding rules, error texts.

Triton's ``triton_python_backend_utils`` exists only inside the stub, so a small fake stands in for it;
the real thing is exercised by tests/integration/test_pybackends.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

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


class FakeLogger:
    """``pb_utils.Logger``: what the stub would write to Triton's log."""

    errors: ClassVar[list[str]] = []

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.errors.append(message)


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
    monkeypatch.setattr(FakeLogger, "errors", [])
    fake.Logger = FakeLogger  # type: ignore[attr-defined]

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


def test_an_unexpected_failure_answers_without_paths_and_logs_the_traceback(pb: types.ModuleType) -> None:
    def run(inputs: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        raise OSError("cannot read /home/exporter/project/weights.bin")

    (response,) = common.execute([_request(1, 1.0)], _spec(), run)
    assert response.error.text == "model 'm' failed: cannot read weights.bin"
    (logged,) = FakeLogger.errors
    assert "Traceback (most recent call last)" in logged
    assert "/home/exporter/project/weights.bin" in logged


def test_a_framework_failure_answers_in_its_own_words_and_logs_the_full_text(pb: types.ModuleType) -> None:
    def run(inputs: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        raise common.ExecuteError("PyTorch execute failure: RuntimeError: boom", detail="full text, traceback and all")

    (response,) = common.execute([_request(1, 1.0)], _spec(), run)
    assert response.error.text == "PyTorch execute failure: RuntimeError: boom"
    assert FakeLogger.errors == ["model 'm', version 1: request failed: full text, traceback and all"]


def test_our_own_request_errors_are_answered_as_they_are_and_not_logged(pb: types.ModuleType) -> None:
    (response,) = common.execute([FakeRequest({}, {"Y"})], _spec(), Recorder())
    assert response.error.text == "model 'm': missing input 'X'"
    assert FakeLogger.errors == []


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
# Error texts (docs/contract.md §2.6: errors raised by the model are 500, in the native wording)


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ('File "/home/alice/proj/model.py", line 12', 'File "model.py", line 12'),
        ("/onnxruntime_src/core/cpu/element_wise_ops.h:563 void Init()", "element_wise_ops.h:563 void Init()"),
        ("/usr/lib/python3.11/site-packages/torch/nn/functional.py(2615): embedding", "functional.py(2615): embedding"),
        ('File "C:\\Users\\bob\\export\\net.py", line 3', 'File "net.py", line 3'),
        # not file paths: ONNX node names, URLs, relative paths, fractions
        ("running Gather node. Name:'/embed/Gather'", "running Gather node. Name:'/embed/Gather'"),
        (
            "see https://onnx.ai/onnx/operators/onnx__Gather.html",
            "see https://onnx.ai/onnx/operators/onnx__Gather.html",
        ),
        ('File "code/__torch__/torch/nn/functional.py"', 'File "code/__torch__/torch/nn/functional.py"'),
        ("and/or 1/2 of [3/4]", "and/or 1/2 of [3/4]"),
    ],
)
def test_absolute_file_paths_are_reduced_to_the_file_name(text: str, scrubbed: str) -> None:
    assert common.scrub_paths(text) == scrubbed


def test_onnx_runtime_statuses_take_the_native_backends_wording() -> None:
    gather = (
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Gather node. "
        "Name:'/embed/Gather' Status Message: indices element out of data bounds, idx=99 must be within the "
        "inclusive range [-10,9]"
    )
    assert common.ort_error_message(gather) == (
        "onnx runtime error 2: Non-zero status code returned while running Gather node. Name:'/embed/Gather' "
        "Status Message: indices element out of data bounds, idx=99 must be within the inclusive range [-10,9]"
    )
    add = (
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Add node. Name:'' "
        "Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/math/element_wise_ops.h:563 void "
        "onnxruntime::BroadcastIterator::Init(ptrdiff_t, ptrdiff_t) axis == 1 || axis == largest was false. "
        "Attempting to broadcast an axis by a dimension other than 1. 3 by 4\n"
    )
    message = common.ort_error_message(add)
    assert message is not None
    assert message.startswith("onnx runtime error 1: Non-zero status code")
    assert "Status Message: element_wise_ops.h:563 void" in message
    assert "/onnxruntime_src" not in message
    assert message.endswith("other than 1. 3 by 4")
    assert common.ort_error_message("Required inputs (['X']) are missing from input feed (['Y']).") is None


def test_torch_summary_drops_the_cpp_backtrace_in_either_format() -> None:
    new = "RuntimeError: index 9 is out of bounds\nC++ CapturedTraceback:\n#4 c10::Error::Error() from ??:0\n#5 _start"
    old = (
        "index 9 is out of bounds\nException raised from index at /pytorch/aten/src/Index.cpp:12 "
        "(most recent call first):\nframe #0: c10::Error::Error() + 0x96 (0x7f in /opt/torch/lib/libc10.so)"
    )
    assert common.torch_error_summary(new) == "RuntimeError: index 9 is out of bounds"
    assert common.torch_error_summary(old) == "index 9 is out of bounds"


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
    model = _init(pt, config, tmp_path)
    a, b = np.array([[5.0, 7.0]], np.float32), np.array([[1.0, 2.0]], np.float32)
    (response,) = model.execute([FakeRequest({"a": a, "b": b}, {"OUTPUT__0"})])
    assert response.error is None
    np.testing.assert_array_equal(response.outputs["OUTPUT__0"], [[4.0, 5.0]])


def _init(backend: types.ModuleType, config: dict[str, Any], repo: Path) -> Any:
    """An initialised stand-in; ``initialize`` sets torch's process-wide thread count, which is put back
    so the test process stays as it was."""
    import torch

    model = backend.TritonPythonModel()
    threads = torch.get_num_threads()
    try:
        model.initialize(_args(config, model_repository=str(repo)))
    finally:
        torch.set_num_threads(threads)
    return model


def _torchscript_failure(
    module: Any, export: str, example: tuple[Any, ...], args: tuple[Any, ...], tmp_path: Path
) -> BaseException:
    """What ``module``, scripted or traced on ``example``, saved and reloaded, raises for ``args``."""
    import torch

    exported = torch.jit.script(module) if export == "script" else torch.jit.trace(module, example)
    exported.save(str(tmp_path / "m.pt"))
    with pytest.raises(Exception) as info:  # noqa: PT011 - TorchScript raises several types; each is examined
        torch.jit.load(str(tmp_path / "m.pt"))(*args)
    return info.value


@pytest.mark.parametrize("export", ["script", "trace"])
def test_torchscript_index_error_keeps_the_error_without_tracebacks_or_paths(
    pt: types.ModuleType, export: str, tmp_path: Path
) -> None:
    import torch

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.pool(ids) * 2

        def pool(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embed(ids).sum(1)

    exc = _torchscript_failure(
        Embed(), export, (torch.zeros(1, 5, dtype=torch.long),), (torch.full((1, 5), 99),), tmp_path
    )
    assert __file__ in str(exc)
    assert "code/__torch__" in str(exc)
    failure = common.torch_failure(exc)
    assert str(failure) == "PyTorch execute failure: RuntimeError: index out of range in self"
    assert failure.detail == str(exc)


def test_torchscript_raise_keeps_the_exception_name_and_message(pt: types.ModuleType, tmp_path: Path) -> None:
    import torch

    class Checked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 100:
                raise ValueError("input too large: " + str(x.shape))
            return x

    exc = _torchscript_failure(Checked(), "script", (), (torch.full((3,), 50.0),), tmp_path)
    assert common.torch_error_summary(str(exc)) == "builtins.ValueError: input too large: [3]"


def test_torchscript_forward_failure_answers_the_native_way_and_the_model_keeps_serving(
    pt: types.ModuleType, pb: types.ModuleType, tmp_path: Path
) -> None:
    import torch

    class Pick(torch.nn.Module):
        def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            return x[0, i[0, 0]].reshape(1)

    (tmp_path / "1").mkdir()
    torch.jit.script(Pick()).save(str(tmp_path / "1" / "model.pt"))
    config = {
        "name": "pick",
        "max_batch_size": 0,
        "input": [
            {"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [1, 3]},
            {"name": "INPUT__1", "data_type": "TYPE_INT64", "dims": [1, 1]},
        ],
        "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    model = _init(pt, config, tmp_path)
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    bad, good = (
        FakeRequest({"INPUT__0": x, "INPUT__1": np.array([[7]])}, {"OUTPUT__0"}),
        FakeRequest({"INPUT__0": x, "INPUT__1": np.array([[2]])}, {"OUTPUT__0"}),
    )
    failed, ok = model.execute([bad, good])
    assert failed.error.text == (
        "PyTorch execute failure: RuntimeError: index 7 is out of bounds for dimension 0 with size 3"
    )
    (logged,) = FakeLogger.errors
    assert "Traceback of TorchScript" in logged
    assert __file__ in logged
    assert ok.error is None
    np.testing.assert_array_equal(ok.outputs["OUTPUT__0"], [3.0])


def _gather_onnx(path: Path) -> None:
    """IDS [batch, 5] int64 -> Y [batch, 5, 3]: rows of a 10-row table, as an embedding looks up tokens."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(10, 3), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "IDS"], ["Y"], name="/embed/Gather", axis=0)],
        "lookup",
        [helper.make_tensor_value_info("IDS", TensorProto.INT64, ["batch", 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 5, 3])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_onnx_runtime_status_answers_the_native_way_and_only_the_bad_request_fails(
    pb: types.ModuleType, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    (tmp_path / "1").mkdir()
    _gather_onnx(tmp_path / "1" / "model.onnx")
    config = {
        "name": "lookup",
        "max_batch_size": 8,
        "input": [{"name": "IDS", "data_type": "TYPE_INT64", "dims": [5]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [5, 3]}],
    }
    model = _load_backend("onnxruntime").TritonPythonModel()
    model.initialize(_args(config, model_repository=str(tmp_path)))
    good, bad = np.zeros((1, 5), np.int64), np.full((1, 5), 99, np.int64)
    ok, failed = model.execute([FakeRequest({"IDS": good}, {"Y"}), FakeRequest({"IDS": bad}, {"Y"})])
    assert ok.error is None
    assert ok.outputs["Y"].shape == (1, 5, 3)
    assert failed.error.text == (
        "onnx runtime error 2: Non-zero status code returned while running Gather node. Name:'/embed/Gather' "
        "Status Message: indices element out of data bounds, idx=99 must be within the inclusive range [-10,9]"
    )
    (logged,) = FakeLogger.errors
    assert "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT" in logged
