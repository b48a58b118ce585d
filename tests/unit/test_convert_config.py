"""config.pbtxt generation: written through the ModelConfig protobuf and read back field by field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from smtriton import model_config
from smtriton.convert.config import ConfigError, build_config, config_dict, recipe_config
from smtriton.convert.recipe import TensorSpec
from smtriton.convert.recipe_parse import parse_recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TEXT = """
[[model]]
name = "enc"
format = "onnx"
factory = "smtriton.demo.models:bert_tiny"
max_batch_size = 16
output = [{ name = "hidden" }]
dynamic_batching = { preferred_batch_size = [4, 8], max_queue_delay_microseconds = 100 }
instance_group = [{ count = 2, kind = "KIND_CPU" }]
parameters = { intra_op_thread_count = "1" }
input = [
  { name = "input_ids", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 10] },
  { name = "attention_mask", dtype = "INT32", shape = ["batch", "sequence"], range = [0, 2] },
]
"""


def spec_from(text: str):
    return parse_recipe(tomllib.loads(text), Path("/x/recipe.toml")).models[0]


def write_and_read(spec, outputs, tmp_path):
    model_config.write(recipe_config(spec, outputs), tmp_path)
    return model_config.read(tmp_path / "config.pbtxt")


def test_batched_model_drops_batch_axis_and_marks_other_axes_dynamic(tmp_path):
    spec = spec_from(TEXT)
    hidden = TensorSpec("hidden", "FP32", ("batch", "sequence", 128))
    config = write_and_read(spec, [hidden], tmp_path)
    assert config.name == "enc"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 16
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input_ids", model_config_pb2.TYPE_INT64, [-1]),
        ("attention_mask", model_config_pb2.TYPE_INT32, [-1]),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("hidden", model_config_pb2.TYPE_FP32, [-1, 128])
    ]


def test_dynamic_batching_instance_group_and_parameters(tmp_path):
    config = write_and_read(spec_from(TEXT), [TensorSpec("hidden", "FP32", ("batch", 4))], tmp_path)
    assert config.HasField("dynamic_batching")
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert [(g.count, g.kind) for g in config.instance_group] == [(2, model_config_pb2.ModelInstanceGroup.KIND_CPU)]
    assert config.parameters["intra_op_thread_count"].string_value == "1"


def test_unbatched_model_keeps_batch_axis_as_minus_one(tmp_path):
    text = TEXT.replace("max_batch_size = 16", "max_batch_size = 0").replace(
        "dynamic_batching = { preferred_batch_size = [4, 8], max_queue_delay_microseconds = 100 }\n", ""
    )
    config = write_and_read(spec_from(text), [TensorSpec("hidden", "FP32", ("batch", 4))], tmp_path)
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, -1]
    assert list(config.output[0].dims) == [-1, 4]


def test_platforms_and_bytes_type(tmp_path):
    text = """
[[model]]
name = "py"
format = "python"
source = "smtriton.demo.triton_models.string_upper"
max_batch_size = 4
input = [{ name = "TEXT", dtype = "BYTES", shape = ["batch", 1] }]
output = [{ name = "UPPER", dtype = "BYTES", shape = ["batch", 1] }]
"""
    spec = spec_from(text)
    config = write_and_read(spec, [o.declared for o in spec.outputs], tmp_path)
    assert config.backend == "python"
    assert config.platform == ""
    assert config.input[0].data_type == model_config_pb2.TYPE_STRING
    assert list(config.input[0].dims) == [1]

    ts = spec_from(
        TEXT.replace('format = "onnx"', 'format = "torchscript"')
        .replace('"input_ids"', '"INPUT__0"')
        .replace('"attention_mask"', '"INPUT__1"')
        .replace('"hidden"', '"OUTPUT__0"')
    )
    assert recipe_config(ts, [TensorSpec("OUTPUT__0", "FP32", ("batch", 2))]).platform == "pytorch_libtorch"


def test_written_file_is_protobuf_text_not_a_template(tmp_path):
    path = model_config.write(recipe_config(spec_from(TEXT), [TensorSpec("hidden", "FP32", ("batch", 4))]), tmp_path)
    text = path.read_text()
    assert 'platform: "onnxruntime_onnx"' in text
    assert "data_type: TYPE_INT64" in text
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed into place


def test_misspelt_field_is_rejected_by_the_protobuf():
    data = config_dict(spec_from(TEXT), [TensorSpec("hidden", "FP32", ("batch", 4))])
    data["dynamic_batchin"] = {}
    with pytest.raises(ConfigError, match='no field named "dynamic_batchin"') as raised:
        build_config(data)
    assert "\n" not in str(raised.value)  # one line, as every tool error


def test_every_pytorch_parameter_the_recipe_documents_is_one_the_backend_reads():
    """The recipe's header documents the PyTorch backend's parameters; `smtriton config` warns about any
    other key, so the two lists name the same parameters (the backend's own spelling)."""
    from smtriton.convert.config import unknown_parameters
    from smtriton.convert.recipe import DEFAULT_RECIPE

    header = DEFAULT_RECIPE.read_text().split("\n[[model]]", 1)[0]
    section = header.split("# PyTorch backend parameters", 1)[1]
    documented = {word.strip(",") for line in section.splitlines() for word in line[1:].split()[:1]
                  if word.strip(",").isupper() and "_" in word}  # fmt: skip
    assert "ENABLE_WEIGHT_SHARING" in documented
    assert unknown_parameters("pytorch_libtorch", dict.fromkeys(documented, "true")) == []
    assert unknown_parameters("pytorch_libtorch", {"ENABLE_TENSOREXPR_FUSER": "false"}) != []
