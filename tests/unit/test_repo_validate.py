"""Repository validation: every problem found once, on one line, naming its file; tiny ONNX graphs, no torch."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from smtriton.cli import app
from smtriton.convert.tensorrt_profiles import RuntimeInfo, Sidecar, sha256_file, write_sidecar
from smtriton.repo.artifacts import TORCHSCRIPT_SIGNATURE
from smtriton.repo.validate import errors, validate_repository

CLASSIFIER = """
name: "clf"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }
dynamic_batching { preferred_batch_size: [ 4 ] }
"""


def tiny_onnx(path: Path, *, batch: str | int = "batch", x_type: int = TensorProto.FLOAT) -> Path:
    """y[batch, 2] = x[batch, 4] @ W (one MatMul; x cast to float when it is not)."""
    nodes, x_name = [], "x"
    if x_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT))
        x_name = "xf"
    nodes.append(helper.make_node("MatMul", [x_name, "w"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", x_type, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 2], [0.5] * 8)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def add_model(repo: Path, name: str, config: str, *, artifact: bool = True, **onnx_kwargs) -> Path:
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(re.sub(r'^name: "clf"', f'name: "{name}"', config, flags=re.M))
    if artifact:
        tiny_onnx(model / "1" / "model.onnx", **onnx_kwargs)
    return model


def lines(repo: Path, **kwargs) -> list[str]:
    return [p.line(repo) for p in errors(validate_repository(repo, **kwargs))]


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    add_model(repo, "clf", CLASSIFIER)
    return repo


def test_consistent_repository_has_no_errors(repo):
    assert validate_repository(repo) == []


def test_missing_artifact_names_the_expected_file(repo):
    (repo / "clf" / "1" / "model.onnx").unlink()
    assert lines(repo) == ["clf/1/model.onnx: error: missing: onnxruntime_onnx loads 1/model.onnx"]


def test_wrong_input_name_lists_the_graph_inputs(repo):
    config = repo / "clf" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "x"', 'name: "pixels"'))
    assert lines(repo) == [
        "clf/config.pbtxt: error: input 'pixels' is not an input of the ONNX graph 1/model.onnx (inputs: x)",
        "clf/config.pbtxt: error: the ONNX graph 1/model.onnx needs input(s) x, which the config does not declare",
    ]


def test_dtype_mismatch(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "clf", CLASSIFIER, x_type=TensorProto.INT64)
    assert lines(repo) == [
        "clf/config.pbtxt: error: input 'x': config data_type TYPE_FP32, the ONNX graph 1/model.onnx has TYPE_INT64"
    ]


def test_batch_dimension_left_in_dims_is_a_rank_error_with_a_hint(repo):
    config = repo / "clf" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 4 ] }\noutput", "dims: [ -1, 4 ] }\noutput"))
    (line,) = lines(repo)
    assert line.startswith("clf/config.pbtxt: error: input 'x': config dims [-1, 4] have rank 2, the ONNX graph")
    assert "leave the batch dimension out of dims" in line


def test_fixed_dimension_must_be_stated_exactly(repo):
    config = repo / "clf" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 4 ]", "dims: [ -1 ]"))
    assert lines(repo) == [
        "clf/config.pbtxt: error: input 'x': config dims [-1] differ from the ONNX graph 1/model.onnx's "
        "shape [batch, 4] at dimension 0"
    ]


def test_batching_config_on_a_graph_with_fixed_batch(tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "clf", CLASSIFIER, batch=1)
    found = lines(repo)
    assert len(found) == 2  # the input and the output
    assert found[0] == (
        "clf/config.pbtxt: error: input 'x': max_batch_size 8 but the ONNX graph 1/model.onnx's first dimension "
        "is fixed (1), shape [1, 4]: Triton cannot batch it (set max_batch_size: 0 and state the full shape)"
    )


def test_unbatched_config_states_the_full_shape(tmp_path):
    repo = tmp_path / "repo"
    unbatched = CLASSIFIER.replace("max_batch_size: 8", "max_batch_size: 0").replace(
        "dynamic_batching { preferred_batch_size: [ 4 ] }", ""
    )
    add_model(repo, "clf", unbatched.replace("dims: [ 4 ]", "dims: [ 1, 4 ]").replace("[ 2 ]", "[ 1, 2 ]"), batch=1)
    assert validate_repository(repo) == []


def test_duplicate_model_name_in_a_multi_model_repository(repo):
    add_model(repo, "clf_v2", CLASSIFIER)
    config = repo / "clf_v2" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "clf_v2"', 'name: "CLF"'))
    assert lines(repo, mme=True) == [
        "clf/config.pbtxt: error: duplicate model name 'clf' (also in clf_v2/config.pbtxt)",
        "clf_v2/config.pbtxt: error: duplicate model name 'CLF' (also in clf/config.pbtxt)",
    ]
    # An SME serves by directory: the mismatch is what Triton refuses there.
    assert lines(repo) == [
        "clf_v2/config.pbtxt: error: name 'CLF' differs from its directory 'clf_v2'; Triton refuses it "
        "(rename with `smtriton package --rename`, which rewrites both)"
    ]


ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input { name: "IMAGE" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "SCORES" data_type: TYPE_FP32 dims: [ 2 ] }
ensemble_scheduling {
  step {
    model_name: "clf"
    model_version: -1
    input_map { key: "x" value: "IMAGE" }
    output_map { key: "y" value: "SCORES" }
  }
}
"""


def test_valid_ensemble(repo):
    add_model(repo, "pipeline", ENSEMBLE, artifact=False)
    assert validate_repository(repo) == []


@pytest.mark.parametrize(
    ("edit", "messages"),
    [
        (('model_name: "clf"', 'model_name: "classifier"'),
         ["ensemble step 1 (classifier): references model 'classifier', which is not in the repository"]),
        (('key: "x"', 'key: "input"'),
         ["ensemble step 1 (clf): input_map key 'input' is not an input of clf (x)",
          "ensemble step 1 (clf): clf input 'x' is not mapped (input_map)"]),
        (('value: "IMAGE"', 'value: "PIXELS"'),
         ["ensemble step 1 (clf): tensor 'PIXELS' is neither an ensemble input nor produced by a step",
          "ensemble input 'IMAGE' is read by no step"]),
        (('value: "SCORES"', 'value: "LOGITS"'),
         ["ensemble output 'SCORES' is produced by no step",
          "ensemble step 1 (clf): output 'y' goes to tensor 'LOGITS', which no step reads and which is no "
          "ensemble output"]),
        (("model_version: -1", "model_version: 3"),
         ["ensemble step 1 (clf): references version 3, which clf does not have"]),
        (("max_batch_size: 8", "max_batch_size: 16"),
         ["ensemble step 1 (clf): ensemble max_batch_size 16 exceeds the model's 8"]),
        (("dims: [ 4 ]", "dims: [ 5 ]"),
         ["ensemble step 1 (clf): tensor 'IMAGE' is TYPE_FP32 [5] (ensemble input 'IMAGE'), clf input 'x' is "
          "TYPE_FP32 [4]"]),
    ],
)  # fmt: skip
def test_broken_ensemble_reference(repo, edit, messages):
    add_model(repo, "pipeline", ENSEMBLE.replace(*edit), artifact=False)
    assert lines(repo) == [f"pipeline/config.pbtxt: error: {message}" for message in messages]


def test_layout_problems(repo):
    (repo / "clf" / "v2").mkdir()
    (repo / "bad name").mkdir()
    (repo / "empty").mkdir()
    (repo / "empty" / "config.pbtxt").write_text('name: "empty"\nbackend: "python"\n')
    found = lines(repo)
    assert (
        "bad name/config.pbtxt: error: missing: every model needs a config.pbtxt (smtriton config writes one)" in found
    )
    assert any(line.startswith("bad name: error: model directory name 'bad name'") for line in found)
    assert "clf/v2: error: version directories must be numeric; Triton ignores 'v2'" in found
    assert "empty: error: no numeric version directory (e.g. 1/): Triton would load nothing" in found
    assert "empty/config.pbtxt: error: declares no inputs" in found


def test_unparsable_config_reports_the_position(repo):
    (repo / "clf" / "config.pbtxt").write_text('name: "clf"\nplatfrom: "onnxruntime_onnx"\n')
    (line,) = lines(repo)
    assert line.startswith("clf/config.pbtxt: error: does not parse as a Triton ModelConfig: 2:1 :")
    assert "platfrom" in line


def test_python_model_needs_its_class(tmp_path):
    repo = tmp_path / "repo"
    model = repo / "py"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "py"\nbackend: "python"\ninput { name: "A" data_type: TYPE_STRING dims: [1] }\n'
        'output { name: "B" data_type: TYPE_STRING dims: [1] }\n'
    )
    (model / "1" / "model.py").write_text("class Model:\n    pass\n")
    assert lines(repo) == [
        "py/1/model.py: error: defines no class TritonPythonModel, which the Python backend instantiates"
    ]


def fake_torchscript(path: Path, signature: dict) -> None:
    """A zip laid out like torch.jit.save's, holding only our signature (enough for the reader)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/extra/" + TORCHSCRIPT_SIGNATURE, json.dumps(signature))
        z.writestr("model/data.pkl", b"")


def test_torchscript_signature_is_compared(tmp_path):
    repo = tmp_path / "repo"
    model = repo / "ts"
    (model / "config.pbtxt").parent.mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "ts"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input { name: "INPUT__0" data_type: TYPE_FP32 dims: [3, 8] }\n'
        'output { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [10] }\n'
    )
    fake_torchscript(
        model / "1" / "model.pt",
        {
            "format": "smtriton.signature/1",
            "inputs": [{"name": "INPUT__0", "dtype": "FP32", "shape": ["batch", 3, 8]}],
            "outputs": [{"name": "OUTPUT__0", "dtype": "FP32", "shape": ["batch", 10]}],
            "max_batch_size": 4,
        },
    )
    assert lines(repo) == [
        "ts/config.pbtxt: error: output 'OUTPUT__0': config data_type TYPE_INT64, the TorchScript model "
        "1/model.pt has TYPE_FP32"
    ]


def plan_repo(tmp_path: Path, *, mbs: int = 8) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    model = repo / "trt"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        f'name: "trt"\nplatform: "tensorrt_plan"\nmax_batch_size: {mbs}\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [4] }\noutput { name: "y" data_type: TYPE_FP32 dims: [2] }\n'
    )
    plan = model / "1" / "model.plan"
    plan.write_bytes(b"not really a plan")
    write_sidecar(
        plan,
        Sidecar(
            tensorrt_version="10.3.0",
            gpu_name="NVIDIA A10G",
            compute_capability="8.6",
            precision="fp16",
            strongly_typed=False,
            profiles=[{"x": {"min": [1, 4], "opt": [4, 4], "max": [8, 4]}}],
            inputs=[{"name": "x", "dtype": "FP32", "shape": ["batch", 4]}],
            outputs=[{"name": "y", "dtype": "FP32", "shape": ["batch", 2]}],
            plan_sha256=sha256_file(plan),
        ),
    )
    return repo, plan


def test_tensorrt_plan_checked_against_its_sidecar_and_the_runtime(tmp_path):
    repo, plan = plan_repo(tmp_path)
    assert validate_repository(repo) == []
    same = RuntimeInfo("10.3.0", "NVIDIA A10G", "8.6")
    assert validate_repository(repo, runtime=same) == []
    other = RuntimeInfo("10.8.0", "NVIDIA L4", "8.9")
    found = lines(repo, runtime=other)
    assert len(found) == 2
    assert found[0].startswith("trt/1/model.plan: error: 1/model.plan: plan built with TensorRT 10.3.0, this runtime")
    assert "compute capability 8.6" in found[1]
    plan.write_bytes(b"another plan")
    assert lines(repo) == [
        "trt/1/model.plan: error: sidecar model.plan.json describes another plan (sha256 differs); rebuild or "
        "rewrite it"
    ]


def test_tensorrt_batch_beyond_the_profiles(tmp_path):
    repo, _ = plan_repo(tmp_path, mbs=16)
    assert lines(repo) == [
        "trt/config.pbtxt: error: max_batch_size 16 exceeds what the plan's profiles accept for input 'x' "
        "(batch up to 8)"
    ]


def test_detect_runtime_checks_plans_against_what_serve_detects(tmp_path, monkeypatch):
    """--detect-runtime compares the plans with the runtime serve would find here (libnvinfer and NVML),
    and where there is none says so in one line."""
    from smtriton.serve.triton import tensorrt_check

    repo, _ = plan_repo(tmp_path)
    monkeypatch.setattr(tensorrt_check, "detect_runtime", lambda: RuntimeInfo("10.8.0", "NVIDIA L4", "8.9"))
    refused = CliRunner().invoke(app, ["validate", str(repo), "--detect-runtime"])
    assert refused.exit_code == 1
    assert "plan built with TensorRT 10.3.0, this runtime" in refused.output
    monkeypatch.setattr(
        tensorrt_check, "detect_runtime", lambda: tensorrt_check.NoRuntime("this host has no NVIDIA GPU")
    )
    missing = CliRunner().invoke(app, ["validate", str(repo), "--detect-runtime"])
    assert missing.exit_code == 1
    assert missing.output.startswith("error: --detect-runtime: this host has no NVIDIA GPU; run it inside")
    assert len(missing.output.splitlines()) == 1


def test_plan_without_sidecar_is_a_warning(tmp_path):
    repo, plan = plan_repo(tmp_path)
    plan.with_name("model.plan.json").unlink()
    (warning,) = validate_repository(repo)
    assert warning.severity == "warning"
    assert "no sidecar" in warning.message


def test_cli_prints_one_line_per_problem_and_exits_non_zero(repo):
    (repo / "clf" / "1" / "model.onnx").unlink()
    add_model(repo, "pipeline", ENSEMBLE.replace('model_name: "clf"', 'model_name: "gone"'), artifact=False)
    result = CliRunner().invoke(app, ["validate", str(repo)])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "clf/1/model.onnx: error: missing: onnxruntime_onnx loads 1/model.onnx",
        "pipeline/config.pbtxt: error: ensemble step 1 (gone): references model 'gone', which is not in the repository",
    ]


def test_cli_accepts_a_valid_repository(repo):
    result = CliRunner().invoke(app, ["validate", str(repo), "--mme"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("onnx_type", "config_type"),
    [(TensorProto.BFLOAT16, "TYPE_BF16"), (TensorProto.UINT16, "TYPE_UINT16"), (TensorProto.UINT32, "TYPE_UINT32"),
     (TensorProto.UINT64, "TYPE_UINT64"), (TensorProto.FLOAT16, "TYPE_FP16"), (TensorProto.STRING, "TYPE_STRING")],
)  # fmt: skip
def test_every_triton_type_is_read_and_validated(repo, tmp_path, onnx_type, config_type):
    """Triton serves BF16 and unsigned 16/32/64-bit tensors: validation and packaging take them."""
    from smtriton.repo.artifacts import onnx_signature
    from smtriton.repo.package import package_sme

    add_model(repo, "wide", CLASSIFIER.replace("TYPE_FP32 dims: [ 4 ]", f"{config_type} dims: [ 4 ]"),
              x_type=onnx_type)  # fmt: skip
    signature = onnx_signature(repo / "wide" / "1" / "model.onnx")
    assert signature.inputs[0].dtype == config_type.removeprefix("TYPE_").replace("STRING", "BYTES")
    assert lines(repo) == []
    assert package_sme(repo, tmp_path / "model.tar.gz").models == ("clf", "wide")
    wrong = CLASSIFIER.replace("TYPE_FP32 dims: [ 4 ]", "TYPE_INT32 dims: [ 4 ]")
    (repo / "wide" / "config.pbtxt").write_text(wrong.replace('name: "clf"', 'name: "wide"'))
    (line,) = lines(repo)
    assert line.endswith(f"input 'x': config data_type TYPE_INT32, the ONNX graph 1/model.onnx has {config_type}")


def test_a_plan_with_bf16_tensors_is_read():
    from smtriton.convert.tensorrt_build import TRT_DTYPES

    assert TRT_DTYPES["BF16"] == "BF16"


PYTHON_MODEL = "import triton_python_backend_utils as pb_utils\n\n\nclass TritonPythonModel:\n    pass\n"


def _python_model_with_env(root: Path, env_path: str) -> Path:
    model = root / "packed"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(PYTHON_MODEL)
    (model / "config.pbtxt").write_text(
        'name: "packed"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "X", data_type: TYPE_INT32, dims: [1] }]\n'
        'output [{ name: "Y", data_type: TYPE_INT32, dims: [1] }]\n'
        f'parameters: {{ key: "EXECUTION_ENV_PATH", value: {{ string_value: "{env_path}" }} }}\n'
    )
    return model


def _packed(target: Path, python: str, activate: bool = True) -> None:
    """An environment archive as conda-pack lays one out (the parts validate reads)."""
    import io
    import tarfile

    with tarfile.open(target, "w:gz") as archive:
        for name, data in ((f"./lib/python{python}/site-packages/x.py", b"X = 1\n"),) + (
            (("./bin/activate", b"export PATH=...\n"),) if activate else ()
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _env_problems(tmp_path: Path, stub_python: str = "3.12") -> list[str]:
    return [p.message for p in errors(validate_repository(tmp_path, stub_python=stub_python))]


def test_a_packed_environment_inside_the_model_with_the_stubs_python_is_accepted(tmp_path):
    model = _python_model_with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    _packed(model / "env.tar.gz", "3.12")
    assert _env_problems(tmp_path) == []
    assert any("holds Python 3.12" in m for m in _env_problems(tmp_path, stub_python="3.11"))  # the cpu image's


@pytest.mark.parametrize(
    ("env_path", "python", "activate", "message"),
    [
        ("/opt/envs/env.tar.gz", "3.12", True, "lies outside the model directory: put the environment in it"),
        ("$$TRITON_MODEL_DIRECTORY/../env.tar.gz", "3.12", True, "lies outside the model directory"),
        ("$$TRITON_MODEL_DIRECTORY/missing.tar.gz", "3.12", True, "missing: EXECUTION_ENV_PATH names it"),
        ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "3.10", True, "holds Python 3.10; the Python backend's stub"),
        ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", "3.12", False, "not a packed environment: it has no bin/activate"),
    ],
)
def test_a_packed_environment_that_would_not_load_is_named_with_why(tmp_path, env_path, python, activate, message):
    model = _python_model_with_env(tmp_path, env_path)
    _packed(model / "env.tar.gz", python, activate)
    (tmp_path / "env.tar.gz").write_bytes((model / "env.tar.gz").read_bytes())  # beside the model: still outside
    found = _env_problems(tmp_path)
    assert any(message in m for m in found), found


PYTHON_BATCHED = """
name: "tok"
backend: "python"
max_batch_size: 8
input { name: "text" data_type: TYPE_STRING dims: [ 1 ] }
output { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }
dynamic_batching { }
"""


def test_validate_says_which_models_serve_merges_and_why(tmp_path):
    add_model(tmp_path, "clf", CLASSIFIER)
    add_model(tmp_path, "tok", PYTHON_BATCHED, artifact=False)
    (tmp_path / "tok" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    declared = PYTHON_BATCHED.replace('name: "tok"', 'name: "rows"')
    add_model(
        tmp_path, "rows", declared + 'parameters { key: "smtriton_merge_rows" value: { string_value: "true" } }\n'
    )
    (tmp_path / "rows" / "1" / "model.onnx").unlink()
    (tmp_path / "rows" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    add_model(tmp_path, "single", CLASSIFIER.replace("dynamic_batching { preferred_batch_size: [ 4 ] }", ""))
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "requests of different clients" in line]
    assert said == [
        "clf: requests of different clients merged (backend onnxruntime runs a batch as one tensor)",
        "rows: requests of different clients merged (smtriton_merge_rows is true)",
        "tok: requests of different clients not merged (backend python may answer a row from the whole request; "
        'declare smtriton_merge_rows "true" if each row\'s answer is its own)',
    ]  # "single" is not batched by Triton: nothing to say


def test_a_merge_declaration_other_than_true_or_false_is_an_error(tmp_path):
    add_model(
        tmp_path, "clf", CLASSIFIER + 'parameters { key: "smtriton_merge_rows" value: { string_value: "yes" } }\n'
    )
    assert lines(tmp_path) == [
        'clf/config.pbtxt: error: parameter smtriton_merge_rows is "true" or "false", not \'yes\'; the front does '
        "not merge this model's requests"
    ]
