"""The conversion CLI without torch: every command explains itself, option parsing, config generation."""

from __future__ import annotations

import pytest
from onnx import TensorProto
from typer.testing import CliRunner

from smtriton import model_config
from smtriton.cli import app
from smtriton.convert.cli_shared import parse_pairs, parse_tensor
from smtriton.convert.config import ConfigError, ConfigOptions, signature_config
from smtriton.convert.recipe import DynamicBatching, InstanceGroup, RecipeError
from smtriton.convert.tensorrt_profiles import parse_size
from smtriton.repo.artifacts import TensorSig, find_artifact, onnx_signature
from tests.unit.test_repo_validate import tiny_onnx


def test_tensor_option_parsing():
    assert parse_tensor("input_ids:INT64:batch,sequence:0..30522", require_type=True) == {
        "name": "input_ids", "dtype": "INT64", "shape": ["batch", "sequence"], "range": [0, 30522],
    }  # fmt: skip
    assert parse_tensor("logits", require_type=False) == {"name": "logits"}
    assert parse_tensor("x:FP32:-1,3", require_type=True)["shape"] == [-1, 3]
    with pytest.raises(RecipeError, match="NAME:DTYPE:DIMS"):
        parse_tensor("logits", require_type=True)
    assert parse_pairs(["a=1", " b = x=y "], "--parameter") == {"a": "1", "b": "x=y"}
    with pytest.raises(RecipeError):
        parse_pairs(["novalue"], "--parameter")


@pytest.mark.parametrize(("text", "size"), [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1G", 1 << 30), ("1024", 1024)])
def test_size_parsing(text, size):
    assert parse_size(text) == size


def test_config_from_an_onnx_graph_with_every_option(tmp_path):
    tiny_onnx(tmp_path / "clf" / "1" / "model.onnx", x_type=TensorProto.INT64)
    signature = onnx_signature(find_artifact(tmp_path / "clf"))
    options = ConfigOptions(
        max_batch_size=8,
        dynamic_batching=DynamicBatching((4, 8), 50),
        instance_groups=(InstanceGroup(2, "KIND_GPU"),),
        parameters={"intra_op_thread_count": "2"},
        warmup=True,
        graph_optimization_level=1,
        accelerator="tensorrt",
        accelerator_parameters={"precision_mode": "FP16"},
    )
    config = signature_config("clf", ("platform", "onnxruntime_onnx"), signature, options)
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [4])]
    assert config.optimization.graph.level == 1
    accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt"
    assert accelerator.parameters["precision_mode"] == "FP16"
    warmup = config.model_warmup[0]
    assert warmup.batch_size == 1
    assert list(warmup.inputs["x"].dims) == [4]
    assert warmup.inputs["x"].zero_data


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ConfigOptions(max_batch_size=0, dynamic_batching=DynamicBatching()), "needs max_batch_size > 0"),
        (ConfigOptions(max_batch_size=4, dynamic_batching=DynamicBatching((8,))), "not in 1..max_batch_size 4"),
        (ConfigOptions(accelerator="cuda"), "'tensorrt' or 'openvino'"),
        (ConfigOptions(accelerator_parameters={"a": "b"}), "need an accelerator"),
    ],
)
def test_config_option_errors(options, message):
    signature_inputs = (TensorSig("x", "FP32", ("batch", 4)),)
    from smtriton.repo.artifacts import Signature

    with pytest.raises(ConfigError, match=message):
        signature_config("m", ("platform", "onnxruntime_onnx"), Signature(signature_inputs, (), "test"), options)


def test_fixed_batch_dimension_cannot_batch():
    from smtriton.repo.artifacts import Signature

    signature = Signature((TensorSig("x", "FP32", (1, 4)),), (), "ONNX graph")
    with pytest.raises(ConfigError, match="fixed first dimension 1"):
        signature_config("m", ("platform", "onnxruntime_onnx"), signature, ConfigOptions(max_batch_size=2))


def test_config_command_writes_and_refuses_to_overwrite(tmp_path):
    model = tmp_path / "clf"
    tiny_onnx(model / "1" / "model.onnx")
    runner = CliRunner()
    result = runner.invoke(app, ["config", str(model), "--max-batch-size", "8", "--instance-kind", "KIND_CPU"])
    assert result.exit_code == 0, result.output
    config = model_config.read(model)
    assert config.name == "clf"
    assert config.max_batch_size == 8
    assert config.HasField("dynamic_batching")
    again = runner.invoke(app, ["config", str(model)])
    assert again.exit_code == 2
    assert "--force overwrites it" in again.output
    unbatched = runner.invoke(app, ["config", str(model), "--force"])
    assert unbatched.exit_code == 0
    assert "--max-batch-size N lets Triton batch them" in unbatched.output
    assert list(model_config.read(model).input[0].dims) == [-1, 4]


def test_config_command_needs_a_signature_or_a_description(tmp_path):
    model = tmp_path / "foreign"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.pt").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: no signature inside
    runner = CliRunner()
    result = runner.invoke(app, ["config", str(model)])
    assert result.exit_code == 2
    assert "describe it with --input and --output-tensor" in result.output
    described = runner.invoke(
        app,
        ["config", str(model), "--stdout", "--input", "INPUT__0:FP32:-1,3", "--output-tensor", "OUTPUT__0:FP32:-1,2"],
    )
    assert described.exit_code == 0, described.output
    assert 'platform: "pytorch_libtorch"' in described.stdout
    assert "dims: -1" in described.stdout


@pytest.mark.parametrize("command", ["onnx", "torchscript"])
@pytest.mark.parametrize(
    ("given", "missing"),
    [
        (["--input", "INPUT__0:FP32:batch,4"], "--output-tensor"),
        (["--output-tensor", "OUTPUT__0"], "--input"),
        ([], "--input and at least one --output-tensor"),
    ],
    ids=["no output", "no input", "neither"],
)
def test_a_factory_without_its_tensors_names_the_flags_not_the_recipe_syntax(tmp_path, command, given, missing):
    result = CliRunner().invoke(
        app, ["convert", command, "--factory", "tests.integration.test_convert_cli:tiny", "-o", str(tmp_path),
              "--max-batch-size", "2", *given],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert f"needs at least one {missing}" in line, line
    assert "[[model" not in line
    assert not any(tmp_path.iterdir())


TRT_RECIPE = """
[[model]]
name = "encoder"
format = "onnx"
factory = "tests.integration.test_convert_cli:tiny"
input = [{ name = "x", dtype = "FP32", shape = [4] }]
output = [{ name = "y" }]

[[model]]
name = "encoder_trt"
format = "tensorrt"
onnx = "encoder"
"""


@pytest.mark.parametrize(
    ("command", "model", "words"),
    [
        ("onnx", "string_upper", "is format 'python'"),
        ("torchscript", "image_pipeline", "is format 'ensemble'"),
        ("onnx", "encoder_trt", "`smtriton convert tensorrt`"),
    ],
)
def test_an_entry_convert_does_not_export_names_the_command_that_builds_it(tmp_path, command, model, words):
    """A recipe's Python model, ensemble or TensorRT plan: one line saying build-repository builds it,
    not the factory rule of the formats convert exports."""
    from smtriton.convert.recipe import DEFAULT_RECIPE

    recipe = DEFAULT_RECIPE
    if model == "encoder_trt":
        recipe = tmp_path / "recipe.toml"
        recipe.write_text(TRT_RECIPE)
    out = tmp_path / "repo"
    result = CliRunner().invoke(app, ["convert", command, str(recipe), "-m", model, "-o", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert words in line, line
    assert f"smtriton build-repository {recipe} -m {model}" in line, line
    assert "factory" not in line
    assert not out.exists()


def test_convert_help_and_the_readme_name_build_repository_for_python_models_and_ensembles():
    from pathlib import Path

    shown = " ".join(CliRunner().invoke(app, ["convert", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "Python models and ensembles are not converted: `smtriton build-repository RECIPE -m NAME`" in shown
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "its Python models and ensembles only it builds" in readme


@pytest.mark.parametrize("command", ["onnx", "torchscript", "tensorrt"])
def test_convert_writes_only_where_output_says(tmp_path, monkeypatch, command):
    """No default --output: a forgotten -o would write into whatever model_repository/ the current
    directory holds. Without it, a usage error naming the option, and nothing written."""
    tiny_onnx(tmp_path / "src" / "1" / "model.onnx")
    (tmp_path / "model_repository").mkdir()
    monkeypatch.chdir(tmp_path)
    args = [str(tmp_path / "src")] if command == "tensorrt" else ["-m", "text_encoder"]
    result = CliRunner().invoke(app, ["convert", command, *args])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: Missing option '--output' / '-o'"), line
    assert not any((tmp_path / "model_repository").iterdir())
    shown = " ".join(CliRunner().invoke(app, ["convert", command, "--help"], env={"COLUMNS": "200"}).output.split())
    assert "into (required)" in shown
    assert "[default: model_repository]" not in shown


def test_the_graph_optimization_levels_in_config_help_are_the_onnxruntime_backends():
    """`smtriton config --help` says what each --graph-optimization-level does, as the onnxruntime backend
    (ours, after NVIDIA's) reads optimization.graph.level: -1 basic, 1 extended, 2 off."""
    import importlib.util
    import re
    from pathlib import Path

    import onnxruntime as ort

    from smtriton.serve.triton import pybackends

    path = Path(pybackends.__file__).parent / "onnxruntime" / "model.py"
    spec = importlib.util.spec_from_file_location("_pybackend_onnxruntime_levels", path)
    assert spec
    assert spec.loader
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    shown = " ".join(CliRunner().invoke(app, ["config", "--help"], env={"COLUMNS": "400"}).output.split())
    said = dict(re.findall(r"(-?\d) (basic|extended|off)\b", shown.split("--graph-optimization-level", 1)[1]))
    words = {
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC: "basic",
        ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED: "extended",
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL: "off",
    }
    assert said == {str(level): words[value] for level, value in backend.GRAPH_LEVELS.items()}
