"""Real TensorRT builds on a real GPU: plans match ONNX Runtime, sidecars match the host, configs validate.

Skipped (tests/gpu/conftest.py) unless tensorrt, cuda-python and an NVIDIA GPU are present. Run them
inside the serving image, where the TensorRT Python package matches the Triton runtime (scripts/gpu-proof.sh).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from smtriton.cli import app
from smtriton.convert.tensorrt_profiles import TOLERANCES, AxisRange, check_compatibility, read_sidecar
from tests.gpu.encoder import Encoder

pytestmark = [pytest.mark.gpu, pytest.mark.tensorrt]

PROFILE = {"batch": AxisRange(1, 4, 8), "sequence": AxisRange(1, 16, 64)}


def encoder_onnx(path: Path) -> Path:
    """ids[batch, sequence] INT64 -> hidden[batch, sequence, 16] FP32: Gather, MatMul, Relu, MatMul."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(Encoder().onnx_model(), str(path))
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_plan_matches_onnx_runtime(tmp_path, precision):
    from smtriton.convert import tensorrt_build

    source = encoder_onnx(tmp_path / "model.onnx")
    plan = tmp_path / "model.plan"
    cache = tmp_path / "timing.cache"
    options = tensorrt_build.BuildOptions(profiles=[PROFILE], precision=precision, timing_cache=cache,
                                     workspace_bytes=1 << 30)  # fmt: skip
    sidecar = tensorrt_build.build_plan(source, plan, options)
    assert cache.stat().st_size > 0
    atol, rtol = TOLERANCES[precision]
    report = tensorrt_build.verify_plan(plan, source, ranges={"ids": (0, 100)}, atol=atol, rtol=rtol)
    assert report.passed, report.summary()
    assert check_compatibility(sidecar, tensorrt_build.runtime_info()) == []
    signature = tensorrt_build.engine_signature(plan)
    assert [(t.name, t.dtype, t.shape) for t in signature.inputs] == [("ids", "INT64", ("batch", "sequence"))]


def test_two_profiles_each_serve_their_range(tmp_path):
    from smtriton.convert import tensorrt_build

    source = encoder_onnx(tmp_path / "model.onnx")
    plan = tmp_path / "model.plan"
    long = {"batch": AxisRange(1, 1, 2), "sequence": AxisRange(65, 128, 256)}
    tensorrt_build.build_plan(source, plan, tensorrt_build.BuildOptions(profiles=[PROFILE, long]))
    run = tensorrt_build.plan_runner(plan)
    import onnxruntime as ort

    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    for shape in ((4, 16), (2, 200), (8, 64)):
        ids = np.random.default_rng(3).integers(0, 100, size=shape)
        np.testing.assert_allclose(
            run({"ids": ids})["hidden"], session.run(["hidden"], {"ids": ids})[0], atol=1e-3, rtol=1e-2
        )


def test_demo_text_encoder_through_the_cli(tmp_path):
    """convert onnx (torch on CPU) -> convert tensorrt (the sequence's bounds given) -> verify -> config ->
    validate here."""
    runner = CliRunner()
    repo = tmp_path / "repo"
    exported = runner.invoke(app, ["convert", "onnx", "-m", "text_encoder", "-o", str(repo), "--trials", "1"])
    assert exported.exit_code == 0, exported.output
    built = runner.invoke(
        app,
        ["convert", "tensorrt", str(repo / "text_encoder"), "-o", str(repo), "--model", "text_encoder",
         "--profile", "batch=1:16:16,sequence=1:32:128", "--precision", "fp16",
         "--timing-cache", str(tmp_path / "timing.cache")],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    assert "parity ok" in built.output
    sidecar = read_sidecar(repo / "text_encoder_trt" / "1" / "model.plan")
    assert sidecar is not None
    assert sidecar.profiles[0]["input_ids"]["max"] == [16, 128]
    checked = runner.invoke(app, ["validate", str(repo), "--detect-runtime"])
    assert checked.exit_code == 0, checked.output


def test_a_recipes_tensorrt_entry_is_built_checked_and_configured(tmp_path):
    """build-repository with a format = "tensorrt" entry: the ONNX entry first, then the plan, its
    sidecar matching this host, the parity check against ONNX Runtime, a config that validates."""
    from smtriton.convert import tensorrt_build
    from smtriton.convert.build import build_repository
    from smtriton.convert.recipe import DEFAULT_RECIPE
    from smtriton.repo.validate import validate_repository

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        DEFAULT_RECIPE.read_text()
        + '\n[[model]]\nname = "text_encoder_trt"\nformat = "tensorrt"\nonnx = "text_encoder"\n'
        + 'tensorrt = { precision = "fp16", workspace = "2GiB", profile = { sequence = [1, 32, 128] } }\n'
    )
    out = tmp_path / "repo"
    report = build_repository(recipe, out, models=["text_encoder_trt"])
    assert [(r.name, r.status) for r in report.results] == [("text_encoder", "built"), ("text_encoder_trt", "built")], [
        r.error for r in report.results
    ]
    parity = report.results[1].parity
    assert parity is not None
    assert parity.passed, parity.summary()
    sidecar = read_sidecar(out / "text_encoder_trt" / "1" / "model.plan")
    assert sidecar is not None
    assert (sidecar.precision, sidecar.max_batch_size) == ("fp16", 16)
    runtime = tensorrt_build.runtime_info()
    assert check_compatibility(sidecar, runtime) == []
    assert [p for p in validate_repository(out, runtime=runtime) if p.severity == "error"] == []
    assert build_repository(recipe, out, models=["text_encoder_trt"]).up_to_date


def test_serve_detects_the_runtime_the_builder_records():
    """serve (libnvinfer + NVML) and the builder (tensorrt module + nvidia-smi) must agree on this host,
    or serve would refuse the plans built here."""
    from smtriton.convert import tensorrt_build
    from smtriton.serve.triton import tensorrt_check

    built = tensorrt_build.runtime_info()
    here = tensorrt_check.detect_runtime()
    assert isinstance(here, tensorrt_check.RuntimeInfo)
    assert (here.gpu_name, here.compute_capability) == (built.gpu_name, built.compute_capability)
    assert here.tensorrt_version.split(".")[:3] == built.tensorrt_version.split(".")[:3]


def test_tune_rebuilds_the_plan_for_precision_and_serves_it(tmp_path):
    """tune --onnx on a real plan: the fp16 candidate is built, served by Triton and measured; the
    winner's output holds the plan it was measured with."""
    import json

    runner = CliRunner()
    source = encoder_onnx(tmp_path / "model.onnx")
    repo = tmp_path / "repo"
    built = runner.invoke(
        app,
        ["convert", "tensorrt", str(source), "-o", str(repo), "--name", "enc_trt", "--max-batch-size", "8",
         "--profile", "batch=1:8:8,sequence=1:16:64", "--no-verify"],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    work, out = tmp_path / "work", tmp_path / "out"
    result = runner.invoke(
        app,
        ["tune", str(repo / "enc_trt"), "--onnx", str(source), "--work-dir", str(work), "-o", str(out),
         "--shape", "ids=16", "--max-trials", "3", "--concurrency", "1,8", "--warmup", "0.5", "--duration", "1",
         "--no-confirm"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (work / "trials.jsonl").read_text().splitlines()]
    fp16 = next(r for r in records if r["changes"].get("trt_precision") == "fp16")
    assert fp16["error"] is None, fp16["error"]
    assert "smtriton.tune." not in fp16["config"]  # the build knobs never reach Triton
    plans = [read_sidecar(p) for p in (work / "engines").glob("*/model.plan")]
    assert "fp16" in {s.precision for s in plans if s is not None}
    winner = json.loads((work / "report.json").read_text())["changes"]
    if "trt_precision" in winner:  # the output carries the plan the winner was measured with
        copied = read_sidecar(out / "1" / "model.plan")
        assert copied is not None
        assert copied.precision == winner["trt_precision"]
    else:
        assert not (out / "1").exists()  # the served plan stays the one to use
