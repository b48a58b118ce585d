"""Recipe parsing: the demo recipe reads as documented, and mistakes are named precisely."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from smtriton.convert.recipe import DEFAULT_RECIPE, RecipeError
from smtriton.convert.recipe_code import source_file
from smtriton.convert.recipe_parse import load_recipe, parse_recipe

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


def test_demo_recipe_lists_the_demo_models_and_the_image_pipeline():
    recipe = load_recipe(DEFAULT_RECIPE)
    assert recipe.names == ("resnet_onnx", "resnet_torchscript", "text_encoder", "string_upper",
                            "image_preprocess", "image_postprocess", "image_pipeline")  # fmt: skip
    assert [m.format for m in recipe.models] == ["onnx", "torchscript", "onnx", "python", "python", "python",
                                                 "ensemble"]  # fmt: skip
    pipeline = recipe.model("image_pipeline")
    assert [s.model for s in pipeline.steps] == ["image_preprocess", "resnet_onnx", "image_postprocess"]
    assert [t.name for t in pipeline.inputs] == ["IMAGE"]
    assert pipeline.samples == "smtriton.demo.images:encoded_images"


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
        (('format = "onnx"', 'format = "tflite"'), "format must be one of"),
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


PIPELINE = """
[[model]]
name = "upper"
format = "python"
source = "smtriton.demo.triton_models.string_upper"
max_batch_size = 8
input = [{ name = "TEXT", dtype = "BYTES", shape = ["batch", 1] }]
output = [{ name = "UPPER", dtype = "BYTES", shape = ["batch", 1] }]

[[model]]
name = "pipe"
format = "ensemble"
max_batch_size = 8
input = [{ name = "IN", dtype = "BYTES", shape = ["batch", 1] }]
output = [{ name = "OUT" }]

[[model.step]]
model = "upper"
input_map = { TEXT = "IN" }
output_map = { UPPER = "OUT" }
"""


def test_an_ensemble_entry_reads_its_steps_and_is_built_after_them():
    recipe = parse(PIPELINE)
    pipe = recipe.model("pipe")
    assert pipe.format == "ensemble"
    (step,) = pipe.steps
    assert (step.model, dict(step.input_map), dict(step.output_map), step.version) == ("upper", {"TEXT": "IN"},
                                                                                      {"UPPER": "OUT"}, -1)  # fmt: skip
    assert pipe.outputs[0].declared is None  # its dtype and shape come from the step that writes it
    assert pipe.axes == {"batch": (1, 4)}
    assert [m.name for m in recipe.build_order(["pipe"])] == ["upper", "pipe"]
    # Listed first, the ensemble is still built after its step's model.
    moved = PIPELINE.split("\n[[model]]\n")
    reordered = parse("\n[[model]]\n".join(["", moved[2], moved[1]]))
    assert [m.name for m in reordered.build_order()] == ["upper", "pipe"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('model = "upper"', 'model = "lower"'),
         "model 'pipe': step 1 names model 'lower', which this recipe does not list (models: upper, pipe)"),
        (('model = "upper"', 'model = "pipe"'), "model 'pipe': step 1 names the ensemble itself"),
        (('input_map = { TEXT = "IN" }', "input_map = {}"),
         "model 'pipe': step 1 (upper): `input_map` must be a non-empty table"),
        (('output_map = { UPPER = "OUT" }', "output_map = { UPPER = 3 }"), "step 1 (upper): `output_map` must be"),
        (('output_map = { UPPER = "OUT" }', 'output_map = { UPPER = "OUT" }\nversion = 0'), "step 1 (upper): version"),
        (('output_map = { UPPER = "OUT" }', 'output_map = { UPPER = "OUT" }\nweight = 1'),
         "model 'pipe': step 1: unknown key(s) weight"),
        (('output = [{ name = "OUT" }]', 'output = [{ name = "OUT" }]\nfactory = "a.b:c"'),
         "model 'pipe' (format ensemble): unknown key(s) factory"),
        (('input = [{ name = "IN", dtype = "BYTES", shape = ["batch", 1] }]', 'input = [{ name = "IN" }]'),
         "input 'IN': missing `dtype`"),
        (('[[model.step]]\nmodel = "upper"\ninput_map = { TEXT = "IN" }\noutput_map = { UPPER = "OUT" }', ""),
         "an ensemble needs at least one"),
    ],
)  # fmt: skip
def test_ensemble_mistakes_are_one_line_naming_the_entry(change, message):
    assert change[0] in PIPELINE
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        parse(PIPELINE.replace(*change))
    assert "\n" not in str(info.value)


def test_ensembles_that_use_each_other_in_a_circle_are_refused():
    second = """
[[model]]
name = "pipe2"
format = "ensemble"
input = [{ name = "IN", dtype = "BYTES", shape = [1] }]
output = [{ name = "OUT" }]
step = [{ model = "pipe", input_map = { IN = "IN" }, output_map = { OUT = "OUT" } }]
"""
    text = PIPELINE.replace('model = "upper"', 'model = "pipe2"') + second
    with pytest.raises(RecipeError, match="model 'pipe' is built from itself: pipe -> pipe2 -> pipe"):
        parse(text)


TRT = """
[[model]]
name = "img"
format = "onnx"
factory = "smtriton.demo.models:resnet18"
max_batch_size = 8
input = [{ name = "pixel_values", dtype = "FP32", shape = ["batch", 3, 224, 224] }]
output = [{ name = "logits" }]
dynamic_batching = { preferred_batch_size = [4, 8] }

[[model]]
name = "img_trt"
format = "tensorrt"
onnx = "img"
tensorrt = { precision = "fp16", workspace = "2GiB" }
"""


def test_a_tensorrt_entry_takes_its_onnx_entrys_batching_and_precision_tolerances():
    recipe = parse(TRT)
    plan = recipe.model("img_trt")
    assert (plan.onnx, plan.max_batch_size) == ("img", 8)
    assert plan.tensorrt is not None
    assert (plan.tensorrt.precision, plan.tensorrt.workspace) == ("fp16", "2GiB")
    assert (plan.parity.atol, plan.parity.rtol, plan.parity.trials) == (5e-2, 5e-2, 2)
    assert [(g.count, g.kind) for g in plan.instance_groups] == [(1, "KIND_GPU")]
    assert plan.dynamic_batching is not None
    assert [m.name for m in recipe.build_order(["img_trt"])] == ["img", "img_trt"]
    own = parse(TRT.replace('onnx = "img"', 'onnx = "img"\nmax_batch_size = 4\ndynamic_batching = false'))
    assert (own.model("img_trt").max_batch_size, own.model("img_trt").dynamic_batching) == (4, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('onnx = "img"', 'onnx = "other"'), "`onnx` must name an ONNX entry of this recipe (img), not 'other'"),
        (('"fp16"', '"fp8"'), "precision must be one of fp32, fp16, bf16, int8, strongly-typed"),
        (('"2GiB"', '"lots"'), "workspace size 'lots'"),
        (('onnx = "img"', 'onnx = "img"\ninput = []'), "(format tensorrt): unknown key(s) input"),
        (('workspace = "2GiB"', "optimization_level = 9"), "optimization_level is 0..5"),
    ],
)  # fmt: skip
def test_tensorrt_mistakes_name_the_entry(change, message):
    assert change[0] in TRT
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        parse(TRT.replace(*change))
    assert "img_trt" in str(info.value)


def test_samples_must_name_a_function():
    with pytest.raises(RecipeError, match=re.escape("`samples` must be 'package.module:function'")):
        parse(IMAGE + 'samples = "smtriton.demo.images"\n')


TEXT_TRT = """
[[model]]
name = "enc"
format = "onnx"
factory = "smtriton.demo.models:bert_tiny"
max_batch_size = 16
input = [
  { name = "input_ids", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 1000] },
  { name = "attention_mask", dtype = "INT32", shape = ["batch", "sequence"], range = [0, 2] },
]
output = [{ name = "pooler_output" }]
axes = { batch = [1, 4], sequence = [7, 32] }

[[model]]
name = "enc_trt"
format = "tensorrt"
onnx = "enc"
tensorrt = { precision = "fp16", profile = { sequence = [1, 128, 512] } }
"""


def test_a_tensorrt_entry_gives_the_bounds_of_every_dynamic_axis_its_plan_accepts():
    """The ONNX entry's axes are the parity check's sizes; the plan's profile has its own bounds."""
    plan = parse(TEXT_TRT).model("enc_trt")
    assert plan.tensorrt is not None
    assert plan.tensorrt.profile == {"sequence": (1, 128, 512)}


def test_a_tensorrt_entry_without_bounds_for_an_axis_is_refused_in_one_line():
    text = TEXT_TRT.replace(", profile = { sequence = [1, 128, 512] }", "")
    with pytest.raises(RecipeError) as info:
        parse(text)
    message = str(info.value)
    assert "\n" not in message
    assert "model 'enc_trt'" in message
    assert "no bounds for axis 'sequence'" in message
    assert "profile = { sequence = [min, opt, max] }" in message


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("{ sequence = [128, 1, 512] }", "min <= opt <= max"),
        ("{ sequence = [1, 512] }", "three positive sizes"),
        ("{ sequence = [1, 128, 512], words = [1, 2, 3] }", "axis 'words', which no input of 'enc' has"),
        ("{ sequence = [1, 128, 512], batch = [1, 8, 16] }", "batch axis is 1..max_batch_size"),
    ],
)
def test_tensorrt_profile_mistakes(profile, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        parse(TEXT_TRT.replace("{ sequence = [1, 128, 512] }", profile))
