"""Recipe parsing: the demo recipe reads as documented, and mistakes are named precisely."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from smtriton.convert.recipe import DEFAULT_RECIPE, RecipeError, load_recipe, parse_recipe, source_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

IMAGE = """
[[model]]
name = "img"
format = "onnx"
factory = "smtriton.demo.models:resnet18"
max_batch_size = 8
input = [{ name = "pixel_values", dtype = "FP32", shape = ["batch", 3, 224, 224] }]
output = [{ name = "logits" }]
"""


def parse(text: str, tmp_path: Path = Path("/nonexistent")):
    return parse_recipe(tomllib.loads(text), tmp_path / "recipe.toml")


def test_demo_recipe_lists_the_four_demo_models():
    recipe = load_recipe(DEFAULT_RECIPE)
    assert recipe.names == ("resnet_onnx", "resnet_torchscript", "text_encoder", "string_upper")
    assert [m.format for m in recipe.models] == ["onnx", "torchscript", "onnx", "python"]


def test_demo_image_models_share_factory_and_seed_so_weights_match():
    recipe = load_recipe(DEFAULT_RECIPE)
    onnx, ts = recipe.model("resnet_onnx"), recipe.model("resnet_torchscript")
    assert (onnx.factory, onnx.seed) == (ts.factory, ts.seed)
    assert [t.name for t in ts.inputs] == ["INPUT__0"]
    assert [t.name for t in ts.outputs] == ["OUTPUT__0"]


def test_demo_text_encoder_spec():
    spec = load_recipe(DEFAULT_RECIPE).model("text_encoder")
    ids, mask = spec.inputs
    assert (ids.name, ids.dtype, ids.range) == ("input_ids", "INT64", (0, 1000))
    assert ids.shape == mask.shape == ("batch", "sequence")
    assert (mask.dtype, mask.range) == ("INT32", (0, 2))
    assert spec.axes == {"batch": (1, 4), "sequence": (7, 32)}
    assert spec.export.opset >= 17
    assert spec.export.dynamo is False
    assert spec.dynamic_batching is not None
    assert spec.dynamic_batching.max_queue_delay_microseconds > 0


def test_demo_python_model_source_resolves_to_the_committed_file():
    spec = load_recipe(DEFAULT_RECIPE).model("string_upper")
    assert source_file(spec).name == "string_upper.py"
    assert spec.outputs[0].declared is not None


def test_defaults_batching_on_and_axis_sizes():
    spec = parse(IMAGE).model("img")
    assert spec.dynamic_batching is not None
    assert spec.axes == {"batch": (1, 4)}
    assert spec.instance_groups == ()
    assert spec.parity.trials == 3
    assert spec.export.opset == 17


def test_unknown_model_name_lookup_lists_models():
    with pytest.raises(KeyError, match="img"):
        parse(IMAGE).model("nope")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('dtype = "FP32"', 'dtype = "FP33"'), "dtype must be one of"),
        (("max_batch_size = 8", "max_batch_size = 8\nfactory_typo = 1"), "unknown key"),
        (('shape = ["batch", 3', 'shape = [3, "batch"'), "must start with 'batch'"),
        (('format = "onnx"', 'format = "tensorrt"'), "format must be one of"),
        (("smtriton.demo.models:resnet18", "smtriton.demo.models"), "package.module:function"),
        (('name = "img"', 'name = "../img"'), "name must match"),
        (("max_batch_size = 8", "max_batch_size = 8\naxes = { batch = [1, 16] }"), "must not exceed"),
        (("max_batch_size = 8", "max_batch_size = 8\naxes = { sequence = [3] }"), "no shape uses"),
        (("max_batch_size = 8", "max_batch_size = 0\ndynamic_batching = true"), "needs max_batch_size > 0"),
        (("max_batch_size = 8", "max_batch_size = 8\nexport = { method = 'trace' }"), "unknown key"),
        (("max_batch_size = 8", "max_batch_size = 8\nsource = 'model.py'"), "`source` is for python models only"),
        (('format = "onnx"', 'format = "python"\nsource = "model.py"'), "`factory` does not apply to python"),
        (('shape = ["batch", 3', 'shape = ["batch", "batch"'), "'batch' may only be the first dimension"),
        (('output = [{ name = "logits" }]', 'output = [{ name = "y" }, { name = "y" }]'), "duplicate output names"),
    ],
)
def test_mistakes_are_reported_with_model_name(change, message):
    old, new = change
    assert old in IMAGE
    with pytest.raises(RecipeError, match=message) as info:
        parse(IMAGE.replace(old, new, 1))
    assert "img" in str(info.value) or "model #1" in str(info.value)


def test_integer_inputs_need_a_range():
    text = IMAGE.replace('dtype = "FP32"', 'dtype = "INT64"')
    with pytest.raises(RecipeError, match="range"):
        parse(text)


def test_torchscript_names_follow_the_pytorch_backend_convention():
    text = IMAGE.replace('format = "onnx"', 'format = "torchscript"')
    with pytest.raises(RecipeError, match="INPUT__0"):
        parse(text)
    ok = text.replace("pixel_values", "INPUT__0").replace('"logits"', '"OUTPUT__0"')
    assert parse(ok).model("img").format == "torchscript"


def test_duplicate_model_names_are_rejected():
    with pytest.raises(RecipeError, match="duplicate model name"):
        parse(IMAGE + IMAGE)


def test_python_models_must_declare_outputs_and_source():
    text = """
[[model]]
name = "py"
format = "python"
source = "smtriton.demo.triton_models.string_upper"
input = [{ name = "TEXT", dtype = "BYTES", shape = [1] }]
output = [{ name = "UPPER" }]
"""
    with pytest.raises(RecipeError, match="declare output dtype and shape"):
        parse(text)
    with pytest.raises(RecipeError, match="need `source`"):
        parse(text.replace('source = "smtriton.demo.triton_models.string_upper"\n', ""))


def test_relative_paths_resolve_against_the_recipe(tmp_path):
    (tmp_path / "mine.py").write_text("# a python model\n")
    text = """
[[model]]
name = "py"
format = "python"
source = "mine.py"
input = [{ name = "TEXT", dtype = "BYTES", shape = [1] }]
output = [{ name = "OUT", dtype = "BYTES", shape = [1] }]
"""
    spec = parse(text, tmp_path).model("py")
    assert source_file(spec) == tmp_path / "mine.py"
    assert spec.max_batch_size == 0
    assert spec.dynamic_batching is None


def test_invalid_toml_names_the_file(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text("[[model]\n")
    with pytest.raises(RecipeError, match=r"recipe\.toml: not valid TOML"):
        load_recipe(path)
