"""Builds the whole demo repository into a temporary directory: real exports, parity, configs, skip, and
the image pipeline checked end to end against its eager reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smtriton import model_config
from smtriton.convert.build import BuildReport, build_repository
from smtriton.convert.recipe import DEFAULT_RECIPE
from smtriton.convert.recipe_parse import load_recipe
from smtriton.convert.reference import load_reference

pytestmark = pytest.mark.integration

TORCH_MODELS = ("resnet_onnx", "resnet_torchscript", "text_encoder")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> BuildReport:
    return build_repository(DEFAULT_RECIPE, tmp_path_factory.mktemp("repo"))


def test_every_demo_model_is_built(built):
    assert built.ok, [r.error for r in built.results]
    assert {r.name: r.status for r in built.results} == dict.fromkeys(load_recipe().names, "built")
    for name in load_recipe().names:
        assert (built.output / name / "config.pbtxt").is_file()
        assert not any(p.name.startswith(".") and p.is_dir() for p in built.output.iterdir())


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_exported_artifacts_match_torch_within_tolerance(built, name):
    result = next(r for r in built.results if r.name == name)
    parity = result.parity
    assert parity is not None
    assert parity.passed, parity.summary()
    spec = load_recipe().model(name)
    assert parity.cases == spec.parity.trials * int(np.prod([len(s) for s in spec.axes.values()]))
    assert parity.max_abs < spec.parity.atol


def test_configs_follow_backend_conventions(built):
    image = model_config.read(built.output / "resnet_onnx")
    assert image.platform == "onnxruntime_onnx"
    assert image.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in image.input] == [("pixel_values", [3, 224, 224])]
    assert [(o.name, list(o.dims)) for o in image.output] == [("logits", [1000])]
    assert image.HasField("dynamic_batching")

    ts = model_config.read(built.output / "resnet_torchscript")
    assert ts.platform == "pytorch_libtorch"
    assert [i.name for i in ts.input] == ["INPUT__0"]
    assert [o.name for o in ts.output] == ["OUTPUT__0"]

    text = model_config.read(built.output / "text_encoder")
    assert [(i.name, list(i.dims)) for i in text.input] == [("input_ids", [-1]), ("attention_mask", [-1])]
    assert [(o.name, list(o.dims)) for o in text.output] == [
        ("last_hidden_state", [-1, 128]),
        ("pooler_output", [128]),
    ]

    upper = model_config.read(built.output / "string_upper")
    assert upper.backend == "python"
    assert (built.output / "string_upper" / "1" / "model.py").is_file()

    pipeline = model_config.read(built.output / "image_pipeline")
    assert pipeline.platform == "ensemble"
    assert pipeline.max_batch_size == 8
    assert [(t.name, model_config.data_type_name(t.data_type), list(t.dims)) for t in pipeline.input] == [
        ("IMAGE", "TYPE_STRING", [1])
    ]
    assert [(t.name, model_config.data_type_name(t.data_type), list(t.dims)) for t in pipeline.output] == [
        ("CLASS_IDS", "TYPE_INT64", [5]),
        ("SCORES", "TYPE_FP32", [5]),
    ]
    assert [s.model_name for s in pipeline.ensemble_scheduling.step] == [
        "image_preprocess", "resnet_onnx", "image_postprocess"
    ]  # fmt: skip


def test_the_image_pipeline_matches_its_eager_reference_end_to_end(built):
    result = next(r for r in built.results if r.name == "image_pipeline")
    parity = result.parity
    assert parity is not None
    assert parity.passed, parity.summary()
    spec = load_recipe().model("image_pipeline")
    assert parity.cases == spec.parity.trials * len(spec.axes["batch"])
    assert {o.name for o in parity.outputs} == {"CLASS_IDS", "SCORES"}
    # Built after the models it runs.
    order = [r.name for r in built.results]
    assert order.index("image_pipeline") > max(order.index(m) for m in ("image_preprocess", "resnet_onnx"))


def test_a_broken_pipeline_entry_fails_the_build_with_one_line(built, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(DEFAULT_RECIPE.read_text().replace('input_map = { LOGITS = "logits" }',
                                                         'input_map = { LOGITS = "pixel_values" }'))  # fmt: skip
    before = (built.output / "image_pipeline" / "config.pbtxt").read_text()
    command = [sys.executable, "-c", "from smtriton.cli import main; main()", "build-repository", str(recipe)]
    result = subprocess.run([*command, "--output", str(built.output)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    failed = [line for line in output.splitlines() if "failed:" in line]
    assert failed == [
        "image_pipeline failed: model 'image_pipeline': ensemble step 3 (image_postprocess): tensor 'pixel_values' "
        "is TYPE_FP32 [3, 224, 224] (output 'PIXEL_VALUES' of step 1 (image_preprocess)), image_postprocess input "
        "'LOGITS' is TYPE_FP32 [1000]; ensemble step 2 (resnet_onnx): output 'logits' goes to tensor 'logits', "
        "which no step reads and which is no ensemble output"
    ]
    # The models it uses were current, and the pipeline built before is still there.
    assert "up to date" in output
    assert (built.output / "image_pipeline" / "config.pbtxt").read_text() == before


def test_second_build_is_skipped_as_up_to_date(built):
    again = build_repository(DEFAULT_RECIPE, built.output)
    assert again.up_to_date
    # The stamp keeps the parity report, so the summary still shows the measured errors.
    assert all(r.parity is not None and r.parity.passed for r in again.results if r.name in TORCH_MODELS)


def test_cli_says_the_repository_is_up_to_date(built):
    command = [sys.executable, "-c", "from smtriton.cli import main; main()", "build-repository"]
    result = subprocess.run([*command, "--output", str(built.output)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "All 7 models up to date" in result.stderr


def test_reference_matches_the_built_onnx_artifact(built):
    import onnxruntime as ort

    for name, sizes in (("resnet_onnx", {"batch": 2}), ("text_encoder", {"batch": 3, "sequence": 19})):
        ref = load_reference(name)
        inputs = ref.make_inputs(seed=11, **sizes)
        session = ort.InferenceSession(
            str(built.output / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs), strict=True))
        for key, want in ref.run(inputs).items():
            np.testing.assert_allclose(got[key], want, atol=1e-4, rtol=1e-3)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_both_image_models_hold_the_same_weights(built):
    import torch

    onnx_ref, ts_ref = load_reference("resnet_onnx"), load_reference("resnet_torchscript")
    pixels = onnx_ref.make_inputs(seed=3)["pixel_values"]
    assert np.array_equal(ts_ref.make_inputs(seed=3)["INPUT__0"], pixels)
    np.testing.assert_array_equal(
        onnx_ref.run({"pixel_values": pixels})["logits"], ts_ref.run({"INPUT__0": pixels})["OUTPUT__0"]
    )
    scripted = torch.jit.load(str(built.output / "resnet_torchscript" / "1" / "model.pt"))
    with torch.no_grad():
        out = scripted(torch.from_numpy(pixels)).numpy()
    np.testing.assert_allclose(out, onnx_ref.run({"pixel_values": pixels})["logits"], atol=1e-4, rtol=1e-3)


def test_the_pipeline_reference_chains_its_steps_references():
    pipeline, pre, net, post = (load_reference(n) for n in ("image_pipeline", "image_preprocess", "resnet_onnx",
                                                            "image_postprocess"))  # fmt: skip
    inputs = pipeline.make_inputs(seed=5, batch=2)
    assert inputs["IMAGE"].shape == (2, 1)
    pixels = pre.run(inputs)["PIXEL_VALUES"]
    want = post.run({"LOGITS": net.run({"pixel_values": pixels})["logits"]})
    got = pipeline.run(inputs)
    assert got["CLASS_IDS"].tolist() == want["CLASS_IDS"].tolist()
    np.testing.assert_array_equal(got["SCORES"], want["SCORES"])


def test_python_model_reference_upper_cases_bytes():
    ref = load_reference("string_upper")
    assert ref.module is None
    inputs = ref.make_inputs(seed=1, batch=3)
    assert inputs["TEXT"].shape == (3, 1)
    assert ref.run(inputs)["UPPER"].tolist() == [[t.decode().upper().encode()] for (t,) in inputs["TEXT"]]


def test_interrupted_build_leaves_no_half_model(tmp_path: Path, monkeypatch):
    from smtriton.convert import export_onnx

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_onnx.OnnxExporter, "export", killed)
    with pytest.raises(KeyboardInterrupt):
        build_repository(DEFAULT_RECIPE, tmp_path, models=["text_encoder"])
    assert [p.name for p in tmp_path.iterdir()] == [".build.lock"]
