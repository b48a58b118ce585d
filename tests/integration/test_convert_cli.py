"""`smtriton convert` / `config` / `validate` on a small model named on the command line (no recipe)."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import pytest
import requests
import torch
from typer.testing import CliRunner

from smtriton import model_config
from smtriton.cli import app
from smtriton.repo.artifacts import onnx_signature, torchscript_signature
from smtriton.repo.validate import validate_repository
from tests.integration.conftest import start_serve

pytestmark = pytest.mark.integration


class TinyScorer(torch.nn.Module):
    """ids INT64 [batch, sequence], scale FP32 [batch, 1] -> scores FP32 [batch, 3]."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 8)
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embedding(ids)).mean(dim=1) * scale


class Noisy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


class PerSample(torch.nn.Module):
    """ids INT64 [batch] (one id per sample) -> vectors FP32 [batch, 4]."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(101, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)


def tiny() -> torch.nn.Module:
    return TinyScorer()


def per_sample() -> torch.nn.Module:
    torch.manual_seed(0)
    return PerSample()


def noisy() -> torch.nn.Module:
    return Noisy()


FACTORY = f"{__name__}:tiny"


def _served_outputs(tmp_path: Path, repo: Path, model: str, inputs: list[dict]) -> list[dict]:
    """The outputs of one JSON request to ``model``, served from ``repo`` by the real serve and Triton."""
    server = start_serve(tmp_path, repo, model)
    try:
        response = requests.post(f"{server.url}/invocations", json={"inputs": inputs}, timeout=30)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    return response.json()["outputs"]


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_factory_model_to_simplified_fp16_onnx(tmp_path):
    repo = tmp_path / "repo"
    code, output = cli(
        "convert", "onnx", "--factory", FACTORY, "--name", "scorer", "-o", repo,
        "--input", "ids:INT64:batch,sequence:0..50", "--input", "scale:FP32:batch,1", "--output-tensor", "scores",
        "--max-batch-size", "4", "--axis", "sequence=3,9", "--simplify", "--fp16",
    )  # fmt: skip
    assert code == 0, output
    assert "parity ok" in output
    assert "atol 0.05" in output  # FP16 tolerances apply by default
    path = repo / "scorer" / "1" / "model.onnx"
    graph = onnx.load(str(path))
    assert onnx.TensorProto.FLOAT16 in {i.data_type for i in graph.graph.initializer}
    signature = onnx_signature(path)  # inputs and outputs stay as declared: FP32 at the boundary
    assert [(t.name, t.dtype, t.shape) for t in signature.inputs] == [
        ("ids", "INT64", ("batch", "sequence")),
        ("scale", "FP32", ("batch", 1)),
    ]
    assert [(t.name, t.dtype) for t in signature.outputs] == [("scores", "FP32")]
    config = model_config.read(repo / "scorer")
    assert config.max_batch_size == 4
    assert [list(i.dims) for i in config.input] == [[-1], [1]]
    assert validate_repository(repo) == []


def test_torchscript_signature_drives_the_generated_config(tmp_path):
    repo = tmp_path / "repo"
    code, output = cli(
        "convert", "torchscript", "--factory", FACTORY, "--name", "scorer_ts", "-o", repo, "--no-config",
        "--input", "INPUT__0:INT64:batch,sequence:0..50", "--input", "INPUT__1:FP32:batch,1",
        "--output-tensor", "OUTPUT__0", "--max-batch-size", "4", "--trials", "1",
    )  # fmt: skip
    assert code == 0, output
    model = repo / "scorer_ts"
    assert not (model / "config.pbtxt").exists()
    signature = torchscript_signature(model / "1" / "model.pt")
    assert signature is not None
    assert signature.max_batch_size == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert torch.jit.load(str(model / "1" / "model.pt")) is not None  # the extra file does not disturb loading

    code, printed = cli("config", model, "--stdout", "--warmup", "--warmup-size", "sequence=5",
                        "--parameter", "INFERENCE_MODE=true", "--instance-kind", "KIND_CPU")  # fmt: skip
    assert code == 0, printed
    assert 'platform: "pytorch_libtorch"' in printed
    assert "max_batch_size: 4" in printed
    assert 'key: "INFERENCE_MODE"' in printed
    assert "random_data: true" in printed
    assert "zero_data: true" in printed
    code, output = cli("config", model, "--warmup", "--warmup-size", "sequence=5")
    assert code == 0, output
    assert validate_repository(repo) == []
    code, output = cli("config", model)
    assert code == 2
    assert "exists; --force overwrites it" in output


def test_torchscript_names_must_follow_the_backend_convention(tmp_path):
    code, output = cli(
        "convert", "torchscript", "--factory", FACTORY, "-o", tmp_path,
        "--input", "ids:INT64:batch,sequence:0..50", "--input", "scale:FP32:batch,1", "--output-tensor", "scores",
    )  # fmt: skip
    assert code == 2
    assert "must be named like INPUT__0" in output


def test_parity_failure_fails_the_conversion(tmp_path):
    code, output = cli(
        "convert", "onnx", "--factory", f"{__name__}:noisy", "-o", tmp_path,
        "--input", "x:FP32:batch,4", "--output-tensor", "y", "--max-batch-size", "2", "--trials", "1",
    )  # fmt: skip
    assert code == 1
    assert "differs from the torch model" in output
    assert "parity FAILED" in output
    assert not (tmp_path / "noisy").exists()  # nothing half-built is left for Triton


def test_recipe_entry_with_overrides(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        f"""
[[model]]
name = "scorer"
format = "onnx"
factory = "{FACTORY}"
max_batch_size = 2
input = [{{ name = "INPUT__0", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 50] }},
         {{ name = "INPUT__1", dtype = "FP32", shape = ["batch", 1] }}]
output = [{{ name = "OUTPUT__0" }}]
axes = {{ sequence = [4] }}
export = {{ opset = 17 }}
"""
    )
    code, output = cli("convert", "onnx", recipe, "-o", tmp_path / "repo", "--opset", "18", "--trials", "1")
    assert code == 0, output
    graph = onnx.load(str(tmp_path / "repo" / "scorer" / "1" / "model.onnx"))
    assert next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) == 18
    # The same entry as TorchScript: ONNX export options are dropped, the entry's names already conform.
    code, output = cli("convert", "torchscript", recipe, "-o", tmp_path / "repo", "--name", "scorer_ts")
    assert code == 0, output
    assert model_config.read(Path(tmp_path / "repo" / "scorer_ts")).platform == "pytorch_libtorch"
    assert validate_repository(tmp_path / "repo") == []


def test_a_per_sample_scalar_input_converts_to_a_config_triton_loads(tmp_path):
    """Issue 15.1 and 15.4: an input of shape [batch] with batching on is declared dims [1] reshaped to [],
    the convert command validates what it wrote, Triton serves it, and `smtriton config` keeps the batching
    the conversion recorded in the ONNX file."""
    repo = tmp_path / "repo"
    code, output = cli(
        "convert", "onnx", "--factory", f"{__name__}:per_sample", "--name", "per_sample", "-o", repo,
        "--input", "ids:INT64:batch:0..100", "--output-tensor", "vectors", "--max-batch-size", "8", "--trials", "1",
    )  # fmt: skip
    assert code == 0, output
    config = model_config.read(repo / "per_sample")
    assert [(list(i.dims), i.HasField("reshape"), list(i.reshape.shape)) for i in config.input] == [([1], True, [])]
    assert validate_repository(repo) == []

    code, printed = cli("config", repo / "per_sample", "--stdout")
    assert code == 0, printed
    assert "max_batch_size: 8" in printed
    assert "dynamic_batching" in printed

    (out,) = _served_outputs(tmp_path, repo, "per_sample",
                             [{"name": "ids", "shape": [3, 1], "datatype": "INT64", "data": [1, 2, 100]}])  # fmt: skip
    assert out["shape"] == [3, 4]
    with torch.no_grad():
        expected = per_sample()(torch.tensor([1, 2, 100])).numpy()
    assert out["data"] == pytest.approx(expected.reshape(-1).tolist(), abs=1e-6)


def test_the_dynamo_exporter_converts_a_model_triton_serves(tmp_path):
    """`convert onnx --dynamo` with the locked onnxscript and onnx-ir: the torch.export-based graph (at
    opset 18, the exporter's own, when none is asked for) keeps the named dynamic axes, passes the parity
    check, and Triton serves it."""
    repo = tmp_path / "repo"
    code, output = cli(
        "convert", "onnx", "--factory", FACTORY, "--name", "scorer", "-o", repo, "--dynamo",
        "--input", "ids:INT64:batch,sequence:0..50", "--input", "scale:FP32:batch,1", "--output-tensor", "scores",
        "--max-batch-size", "4", "--axis", "sequence=3,9", "--trials", "1", "--seed", "0",
    )  # fmt: skip
    assert code == 0, output
    assert "parity ok" in output
    assert "Setting ONNX exporter to use operator set" not in output  # the exporter's chatter is held back
    path = repo / "scorer" / "1" / "model.onnx"
    assert next(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx")) == 18
    signature = onnx_signature(path)
    assert [(t.name, t.shape) for t in signature.inputs] == [("ids", ("batch", "sequence")), ("scale", ("batch", 1))]

    ids = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    flat = [i for row in ids for i in row]
    (out,) = _served_outputs(tmp_path, repo, "scorer",
                             [{"name": "ids", "shape": [2, 5], "datatype": "INT64", "data": flat},
                              {"name": "scale", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 2.0]}])  # fmt: skip
    assert out["shape"] == [2, 3]
    torch.manual_seed(0)  # what --seed 0 did before the factory ran
    with torch.no_grad():
        expected = tiny()(torch.tensor(ids), torch.tensor([[1.0], [2.0]])).numpy()
    assert out["data"] == pytest.approx(expected.reshape(-1).tolist(), abs=1e-5)


def test_the_dynamo_exporter_converts_the_demo_bert_to_the_recipes_opset(tmp_path):
    code, output = cli("convert", "onnx", "-m", "text_encoder", "--dynamo", "-o", tmp_path, "--trials", "1")
    assert code == 0, output
    assert "parity ok" in output
    graph = onnx.load(str(tmp_path / "text_encoder" / "1" / "model.onnx"), load_external_data=False)
    assert next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) == 17  # the recipe's
    assert validate_repository(tmp_path) == []


def test_an_opset_the_dynamo_exporter_cannot_convert_to_is_one_line_saying_what_to_ask_for(tmp_path):
    code, output = cli(
        "convert", "onnx", "--factory", FACTORY, "-o", tmp_path, "--dynamo", "--opset", "17",
        "--input", "ids:INT64:batch,sequence:0..50", "--input", "scale:FP32:batch,1", "--output-tensor", "scores",
        "--max-batch-size", "4", "--trials", "1",
    )  # fmt: skip
    assert code == 1, output
    (line,) = output.strip().splitlines()
    assert line.startswith("error: the torch.export-based exporter wrote opset 18"), line
    assert "--opset 18" in line


class Pair(torch.nn.Module):
    """x FP32 [batch, 4] -> two tensors, through a Linear(4, 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        return y, y * 2


def pair() -> torch.nn.Module:
    return Pair()


def tagger() -> torch.nn.Module:
    """Token ids -> per-token logits: an embedding, which takes integer indices only."""
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3))


def test_what_the_flags_declare_wrongly_is_said_in_the_flags_words(tmp_path):
    """A model described by flags, not a recipe: each mistake is one line naming the flag to correct, and
    a shape the model cannot take names each input's declared shape beside torch's own words."""
    base = ["convert", "onnx", "--factory", f"{__name__}:pair", "-o", tmp_path, "--max-batch-size", "2"]
    cases = {
        "outputs": (["--input", "x:FP32:batch,4", "--output-tensor", "y"],
                    "forward() returns 2 tensors, --output-tensor is given 1 time(s); give it once per tensor"),
        "range": (["--input", "x:INT64:batch,4", "--output-tensor", "y", "--output-tensor", "z"],
                  "integer inputs need their values' range, LOW..HIGH with LOW < HIGH (HIGH excluded), "
                  "e.g. --input x:INT64:batch,4:0..30522"),
        "shape": (["--input", "x:FP32:batch,5", "--output-tensor", "y", "--output-tensor", "z"],
                  "forward() failed on inputs as declared: x FP32 [batch, 5] (sent [1, 5]); torch's error is about "
                  "a shape: if one is wrong, correct --input (RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        "dtype": (["--factory", f"{__name__}:tagger", "--input", "ids:FP32:batch,3", "--output-tensor", "logits"],
                  "forward() failed on inputs as declared: ids FP32 [batch, 3] (sent [1, 3]); torch's error is about "
                  "a dtype: if one is wrong, correct --input (RuntimeError: Expected tensor for argument #1 'indices' "
                  "to have one of the following scalar types: Long, Int; but got torch.FloatTensor instead"),
    }  # fmt: skip
    for case, (args, words) in cases.items():
        result = CliRunner().invoke(app, [str(a) for a in [*base, *args]])
        assert result.exit_code == 2, (case, result.output)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: "), (case, line)
        assert words in line, (case, line)
        assert "recipe" not in line, (case, line)


def test_a_recipe_shape_the_model_cannot_take_names_the_recipes_input(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"""
[[model]]
name = "pair"
format = "onnx"
factory = "{__name__}:pair"
max_batch_size = 2
input = [{{ name = "x", dtype = "FP32", shape = ["batch", 5] }}]
output = [{{ name = "y" }}, {{ name = "z" }}]
""")
    code, output = cli("convert", "onnx", recipe, "-o", tmp_path / "repo")
    assert code == 2, output
    assert (
        "x FP32 [batch, 5] (sent [1, 5]); torch's error is about a shape: if one is wrong, correct the recipe's "
        "input shapes" in output
    )
    recipe.write_text(f"""
[[model]]
name = "tagger"
format = "onnx"
factory = "{__name__}:tagger"
max_batch_size = 2
input = [{{ name = "ids", dtype = "FP32", shape = ["batch", "sequence"] }}]
output = [{{ name = "logits" }}]
""")
    code, output = cli("convert", "onnx", recipe, "-o", tmp_path / "repo")
    assert code == 2, output
    assert (
        "ids FP32 [batch, sequence] (sent [1, 1]); torch's error is about a dtype: if one is wrong, correct the "
        "recipe's input dtypes (RuntimeError: Expected tensor for argument #1 'indices'" in output
    )
