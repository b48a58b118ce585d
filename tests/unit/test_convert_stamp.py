"""Build stamps: a model is skipped exactly when nothing that shapes its artifact has changed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from smtriton.convert.recipe_parse import parse_recipe
from smtriton.convert.stamp import STAMP_FILE, StampInputs, is_up_to_date, read_stamp, stamp_inputs, write_stamp

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECIPE = """
[[model]]
name = "m"
format = "onnx"
factory = "{module}:build"
max_batch_size = 4
input = [{{ name = "x", dtype = "FP32", shape = ["batch", 3] }}]
output = [{{ name = "y" }}]
"""


@pytest.fixture
def local_factory(tmp_path, request):
    """A factory module beside the recipe, named per test so the import system never caches it."""
    module = f"factory_{request.node.name.replace('[', '_').replace(']', '_')}"
    (tmp_path / f"{module}.py").write_text("def build():\n    return None\n")
    return module


def spec_for(tmp_path: Path, module: str, text: str = RECIPE):
    return parse_recipe(tomllib.loads(text.format(module=module)), tmp_path / "recipe.toml").models[0]


def test_key_is_stable_for_unchanged_inputs(tmp_path, local_factory):
    spec = spec_for(tmp_path, local_factory)
    assert stamp_inputs(spec).key() == stamp_inputs(spec).key()


def test_key_changes_with_the_recipe_entry(tmp_path, local_factory):
    before = stamp_inputs(spec_for(tmp_path, local_factory)).key()
    changed = spec_for(tmp_path, local_factory, RECIPE.replace("max_batch_size = 4", "max_batch_size = 8"))
    assert stamp_inputs(changed).key() != before


def test_key_changes_with_the_factory_source(tmp_path, local_factory):
    spec = spec_for(tmp_path, local_factory)
    before = stamp_inputs(spec).key()
    (tmp_path / f"{local_factory}.py").write_text("def build():\n    return 1\n")
    assert stamp_inputs(spec).key() != before


def test_key_changes_with_a_tool_version(tmp_path, local_factory):
    inputs = stamp_inputs(spec_for(tmp_path, local_factory))
    assert "torch" in inputs.versions
    assert "python" in inputs.versions
    bumped = StampInputs(inputs.spec, inputs.files, {**inputs.versions, "torch": "99.0"})
    assert bumped.key() != inputs.key()


def test_model_is_up_to_date_only_with_matching_key_and_all_files(tmp_path, local_factory):
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(b"onnx")
    (model_dir / "config.pbtxt").write_text('name: "m"')
    inputs = stamp_inputs(spec_for(tmp_path, local_factory))
    write_stamp(model_dir, inputs, {"parity": None})

    stamp = read_stamp(model_dir)
    assert stamp is not None
    assert set(stamp["files"]) == {"1/model.onnx", "config.pbtxt"}
    assert is_up_to_date(model_dir, inputs.key())
    assert not is_up_to_date(model_dir, "another key")

    (model_dir / "1" / "model.onnx").write_bytes(b"truncated")  # size changed
    assert not is_up_to_date(model_dir, inputs.key())
    (model_dir / "1" / "model.onnx").unlink()
    assert not is_up_to_date(model_dir, inputs.key())


def test_missing_or_corrupt_stamp_means_rebuild(tmp_path):
    assert not is_up_to_date(tmp_path / "absent", "k")
    tmp_path.joinpath(STAMP_FILE).write_text("{not json")
    assert read_stamp(tmp_path) is None
    assert not is_up_to_date(tmp_path, "k")
