"""tune's TensorRT knobs without TensorRT: which plan a candidate needs (the served one, or one rebuilt
with which precision and profiles), the cache of built plans, and where a rebuilt plan goes in a
trial's model folder and in the output. The build itself is a stand-in that records what it was asked;
a real build and serve run in tests/gpu."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from smtriton import model_config
from smtriton.cli import app
from smtriton.convert.tensorrt_profiles import AxisRange, Sidecar, read_sidecar, sha256_file, write_sidecar
from smtriton.errors import ToolUsageError
from smtriton.tune.engines import BUILD_PREFIX, PlanBuilder, served_batch_limit
from smtriton.tune.knobs import apply, knobs_for
from smtriton.tune.trial import scratch_repository

CONFIG = """
name: "enc_trt" platform: "tensorrt_plan" max_batch_size: 8
input { name: "ids" data_type: TYPE_INT64 dims: -1 }
output { name: "hidden" data_type: TYPE_FP32 dims: [-1, 16] }
instance_group { count: 1 kind: KIND_GPU }
"""


def sidecar(precision: str = "fp32", onnx_sha256: str | None = None) -> Sidecar:
    return Sidecar(
        tensorrt_version="10.9.0", gpu_name="NVIDIA H100", compute_capability="9.0", precision=precision,
        strongly_typed=False, profiles=[{"ids": {"min": [1, 1], "opt": [8, 16], "max": [8, 64]}}],
        inputs=[{"name": "ids", "dtype": "INT64", "shape": ["batch", "sequence"]}],
        outputs=[{"name": "hidden", "dtype": "FP32", "shape": ["batch", "sequence", 16]}],
        plan_sha256="0" * 64, onnx_sha256=onnx_sha256, max_batch_size=8,
    )  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Path]:
    """(model folder with a served plan and its sidecar, the ONNX file it came from)."""
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx graph")
    folder = tmp_path / "repo" / "enc_trt"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.plan").write_bytes(b"served plan")
    (folder / "1" / "notes.txt").write_text("kept beside the plan")
    write_sidecar(folder / "1" / "model.plan", sidecar(onnx_sha256=sha256_file(onnx)))
    (folder / "config.pbtxt").write_text(CONFIG)
    return folder, onnx


class StandIn:
    """A build_plan that writes a plan naming what it was asked for, and keeps the options."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, onnx: Path, plan: Path, options: Any) -> Sidecar:
        self.calls.append(options)
        plan.write_bytes(f"plan {options.precision}".encode())
        made = sidecar(options.precision)
        write_sidecar(plan, made)
        return made


def builder_for(model: tuple[Path, Path], tmp_path: Path) -> tuple[PlanBuilder, StandIn, Any]:
    folder, onnx = model
    build = StandIn()
    config = model_config.read(folder)
    return PlanBuilder(folder, config, onnx, tmp_path / "work", build), build, config


def candidate(builder: PlanBuilder, base: Any, changes: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    knobs = builder.knobs(base) + knobs_for(base)
    return PlanBuilder.split(apply(base, changes, knobs))


def test_the_served_plan_gives_the_baseline_values_and_triton_never_sees_the_build_knobs(model, tmp_path):
    builder, _, base = builder_for(model, tmp_path)
    knobs = builder.knobs(base)
    assert [(k.name, k.read(base)) for k in knobs] == [("trt_precision", "fp32"), ("trt_opt_batch", "max")]
    both = apply(base, {"trt_precision": "fp16", "trt_opt_batch": "1"}, knobs)
    config, build = PlanBuilder.split(both)
    assert build == {"trt_precision": "fp16", "trt_opt_batch": "1"}
    assert BUILD_PREFIX not in model_config.to_text(config)
    assert config == base


def test_a_candidate_with_the_served_build_serves_the_served_plan(model, tmp_path):
    builder, build, base = builder_for(model, tmp_path)
    config, wanted = candidate(builder, base, {"instance_count": 2})
    built = builder.plan_for(config, wanted)
    assert built.plan == model[0] / "1" / "model.plan"
    assert not built.rebuilt
    assert builder.files(built) == {}
    assert build.calls == []


def test_precision_and_optimal_batch_rebuild_with_the_served_profile_otherwise(model, tmp_path):
    builder, build, base = builder_for(model, tmp_path)
    built = builder.plan_for(*candidate(builder, base, {"trt_precision": "fp16"}))
    assert built.rebuilt
    assert built.plan.read_bytes() == b"plan fp16"
    [options] = build.calls
    assert options.precision == "fp16"
    assert options.profiles == [{"batch": AxisRange(1, 8, 8), "sequence": AxisRange(1, 16, 64)}]
    assert options.timing_cache == tmp_path / "work" / "engines" / "timing.cache"  # one cache for every build
    sidecar_written = read_sidecar(built.plan)
    assert sidecar_written is not None
    assert sidecar_written.max_batch_size == 8

    builder.plan_for(*candidate(builder, base, {"trt_opt_batch": "1"}))
    assert build.calls[-1].profiles[0]["batch"] == AxisRange(1, 1, 8)
    assert build.calls[-1].precision == "fp32"


def test_a_larger_max_batch_size_rebuilds_a_plan_that_accepts_it(model, tmp_path):
    builder, build, base = builder_for(model, tmp_path)
    builder.plan_for(*candidate(builder, base, {"max_batch_size": 16}))
    assert build.calls[-1].profiles[0]["batch"] == AxisRange(1, 8, 16)  # the served opt, the new max
    builder.plan_for(*candidate(builder, base, {"max_batch_size": 16, "trt_opt_batch": "max"}))
    assert build.calls[-1].profiles[0]["batch"] == AxisRange(1, 16, 16)  # "max" follows max_batch_size
    # without --onnx the served plan's limit bounds the knob instead
    assert served_batch_limit(model[0], base) == 8


def test_a_plan_is_built_once_for_the_same_settings(model, tmp_path):
    builder, build, base = builder_for(model, tmp_path)
    first = builder.plan_for(*candidate(builder, base, {"trt_precision": "fp16"}))
    again = builder.plan_for(*candidate(builder, base, {"trt_precision": "fp16", "instance_count": 2}))
    assert again.plan == first.plan
    assert len(build.calls) == 1
    # a second run of tune finds it too
    rerun, build_again, _ = builder_for(model, tmp_path)
    assert rerun.plan_for(*candidate(rerun, base, {"trt_precision": "fp16"})).plan == first.plan
    assert build_again.calls == []


def test_a_trial_folder_and_the_output_hold_the_rebuilt_plan_beside_the_rest(model, tmp_path):
    builder, _, base = builder_for(model, tmp_path)
    config, wanted = candidate(builder, base, {"trt_precision": "fp16"})
    built = builder.plan_for(config, wanted)
    folder = scratch_repository(model[0], config, tmp_path / "trial" / "repo", builder.files(built))
    assert (folder / "1" / "model.plan").read_bytes() == b"plan fp16"
    assert os.path.realpath(folder / "1" / "model.plan.json") == os.path.realpath(built.plan) + ".json"
    assert (folder / "1" / "notes.txt").read_text() == "kept beside the plan"
    assert model_config.read(folder) == config
    assert (model[0] / "1" / "model.plan").read_bytes() == b"served plan"  # the user's files untouched

    out = tmp_path / "out"
    written = builder.copy_into(built, out)
    assert sorted(p.relative_to(out).as_posix() for p in written) == ["1/model.plan", "1/model.plan.json"]
    assert not (out / "1" / "model.plan").is_symlink()


def test_rebuilding_needs_the_sidecar_and_the_onnx_the_plan_came_from(model, tmp_path):
    folder, onnx = model
    config = model_config.read(folder)
    other = tmp_path / "other.onnx"
    other.write_bytes(b"another graph")
    with pytest.raises(ToolUsageError, match="was not built from"):
        PlanBuilder(folder, config, other, tmp_path / "work")
    (folder / "1" / "model.plan.json").unlink()
    with pytest.raises(ToolUsageError, match="has no sidecar"):
        PlanBuilder(folder, config, onnx, tmp_path / "work")


def test_onnx_is_refused_for_a_model_that_is_no_plan(tmp_path):
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'name: "m" platform: "onnxruntime_onnx" max_batch_size: 0\n'
        'input { name: "x" data_type: TYPE_FP32 dims: 4 }\noutput { name: "y" data_type: TYPE_FP32 dims: 4 }\n'
    )
    result = CliRunner().invoke(app, ["tune", str(folder), "--onnx", str(tmp_path / "x.onnx"), "--work-dir",
                                      str(tmp_path / "w")])  # fmt: skip
    assert result.exit_code == 2
    assert "--onnx is for TensorRT plan models" in result.output
