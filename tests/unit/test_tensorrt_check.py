"""serve's refusal of TensorRT plans built for another TensorRT version or GPU (serve/triton/tensorrt_check.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from smtriton.serve.errors import BadRequest
from smtriton.serve.multimodel.registry import ModelRegistry
from smtriton.serve.owner.startup import RepositoryError, refuse_unrunnable_plans
from smtriton.serve.settings import Settings
from smtriton.serve.triton import tensorrt_check
from smtriton.serve.triton.tensorrt_check import NoRuntime, check_model, decode_lib_version
from smtriton.serve.triton.tensorrt_sidecar import RuntimeInfo, Sidecar, sidecar_path, write_sidecar

A10G = RuntimeInfo("10.3.0", "NVIDIA A10G", "8.6")
CONFIG = 'name: "{name}"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'


def plan_model(
    root: Path,
    name: str = "encoder",
    *,
    config: str = CONFIG,
    version: str = "1",
    filename: str = "model.plan",
    sidecar: bool = True,
    **built: object,
) -> Path:
    """A model directory holding a (fake) plan and, unless told otherwise, its sidecar."""
    model = root / name
    (model / version).mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(config.format(name=name))
    plan = model / version / filename
    plan.write_bytes(b"not really a plan")
    if sidecar:
        side = Sidecar("10.3.0", "NVIDIA A10G", "8.6", "fp16", False, [], [], [], "0" * 64)
        for key, value in built.items():
            setattr(side, key, value)
        write_sidecar(plan, side)
    return model


@pytest.fixture(autouse=True)
def no_host_detection(monkeypatch):
    """Every check here gets its runtime injected; detecting this host's would be a test bug."""

    def detect() -> NoRuntime:
        raise AssertionError("the host runtime was detected")

    monkeypatch.setattr(tensorrt_check, "detect_runtime", detect)


def test_a_plan_built_for_this_runtime_passes(tmp_path):
    assert check_model(plan_model(tmp_path), A10G) == []


def test_another_tensorrt_version_is_refused_with_the_plan_named(tmp_path):
    problems = check_model(plan_model(tmp_path, tensorrt_version="10.0.0"), A10G)
    assert problems == [
        "encoder/1/model.plan: plan built with TensorRT 10.0.0, this runtime has TensorRT 10.3.0; "
        "rebuild it inside the serving image"
    ]


def test_another_gpu_is_refused(tmp_path):
    problems = check_model(plan_model(tmp_path), RuntimeInfo("10.3.0", "NVIDIA L4", "8.9"))
    assert len(problems) == 1
    assert "plan built on NVIDIA A10G (compute capability 8.6), this GPU is NVIDIA L4" in problems[0]


def test_a_version_compatible_plan_runs_on_a_later_tensorrt(tmp_path):
    model = plan_model(tmp_path, version_compatible=True)
    assert check_model(model, RuntimeInfo("10.8.0", "NVIDIA A10G", "8.6")) == []
    assert "not a later release" in check_model(model, RuntimeInfo("11.0.0", "NVIDIA A10G", "8.6"))[0]


def test_a_plan_without_sidecar_is_let_through_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="serve"):
        assert check_model(plan_model(tmp_path, sidecar=False), NoRuntime("this host has no NVIDIA GPU")) == []
    assert "encoder/1/model.plan has no sidecar (model.plan.json)" in caplog.text


def test_an_unreadable_sidecar_is_let_through_with_a_warning(tmp_path, caplog):
    model = plan_model(tmp_path)
    sidecar_path(model / "1" / "model.plan").write_text('{"format": "smtriton.tensorrt-plan/99"}')
    with caplog.at_level(logging.WARNING, logger="serve"):
        assert check_model(model, A10G) == []
    assert "sidecar cannot be read" in caplog.text


def test_without_a_runtime_the_plan_is_refused_saying_what_it_needs(tmp_path):
    reason = "this host has no TensorRT runtime (libnvinfer) and no NVIDIA GPU"
    problems = check_model(plan_model(tmp_path, tensorrt_version="10.0.0"), NoRuntime(reason))
    assert problems == [
        "encoder/1/model.plan was built for NVIDIA A10G (compute capability 8.6) with TensorRT 10.0.0, and " + reason
    ]


def test_other_backends_are_not_checked_and_detect_nothing(tmp_path, monkeypatch):
    model = plan_model(tmp_path, config='name: "{name}"\nbackend: "onnxruntime"\n', tensorrt_version="1.0.0")
    assert check_model(model) == []  # the autouse fixture fails the test if detection ran
    (model / "config.pbtxt").write_text("this is { not a config")
    assert check_model(model) == []  # a broken config is Triton's (or staging's) to report


@pytest.mark.parametrize(
    "config",
    [
        'name: "{name}"\nbackend: "tensorrt"\n',
        'name: "{name}"\n',  # no platform or backend: Triton's auto-complete finds model.plan
        'name: "{name}"\nplatform: "tensorrt_plan"\ndefault_model_filename: "engine.plan"\n',
    ],
)
def test_tensorrt_models_are_recognised_by_backend_platform_or_plan_file(tmp_path, config):
    filename = "engine.plan" if "engine.plan" in config else "model.plan"
    model = plan_model(tmp_path, config=config, filename=filename, tensorrt_version="10.0.0")
    assert len(check_model(model, A10G)) == 1


def test_only_the_versions_triton_serves_are_checked(tmp_path):
    model = plan_model(tmp_path, version="1", tensorrt_version="10.0.0")
    plan_model(tmp_path, version="2")
    assert check_model(model, A10G) == []  # default policy: the latest version only
    config = CONFIG.format(name="encoder")
    (model / "config.pbtxt").write_text(config + "version_policy: { all: {} }\n")
    assert [p.split(":")[0] for p in check_model(model, A10G)] == ["encoder/1/model.plan"]
    (model / "config.pbtxt").write_text(config + "version_policy: { specific: { versions: [1] } }\n")
    assert len(check_model(model, A10G)) == 1


def test_the_plan_triton_picks_for_this_gpu_is_the_one_checked(tmp_path):
    config = CONFIG + 'cc_model_filenames: {{ key: "8.9" value: "l4.plan" }}\n'
    model = plan_model(tmp_path, config=config)  # model.plan: built for this A10G
    plan_model(tmp_path, config=config, filename="l4.plan", gpu_name="NVIDIA L4", compute_capability="8.9")
    assert check_model(model, A10G) == []
    assert check_model(model, RuntimeInfo("10.3.0", "NVIDIA L4", "8.9")) == []
    assert len(check_model(model, RuntimeInfo("10.3.0", "NVIDIA L40S", "8.9"))) == 1


def test_lib_versions_decode_both_encodings():
    assert decode_lib_version(100300) == "10.3.0"
    assert decode_lib_version(101401) == "10.14.1"
    assert decode_lib_version(8601) == "8.6.1"


def test_runtime_detection_names_what_is_missing(monkeypatch):
    monkeypatch.undo()  # the real detect_runtime, with its parts faked
    detect = tensorrt_check.detect_runtime
    cases = [
        ("10.3.0", [("NVIDIA A10G", "8.6")], A10G),
        (None, [("NVIDIA A10G", "8.6")], NoRuntime("this host has no TensorRT runtime (libnvinfer)")),
        ("10.3.0", [], NoRuntime("this host has no NVIDIA GPU")),
        (None, [], NoRuntime("this host has no TensorRT runtime (libnvinfer) and no NVIDIA GPU")),
    ]
    try:
        for version, gpus, expected in cases:
            monkeypatch.setattr(tensorrt_check, "tensorrt_version", lambda v=version: v)
            monkeypatch.setattr(tensorrt_check, "gpu_models", lambda g=gpus: g)
            detect.cache_clear()
            assert detect() == expected
    finally:
        detect.cache_clear()  # no fake answer outlives the test


def test_sme_start_up_refuses_a_default_model_whose_ensemble_steps_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorrt_check, "detect_runtime", lambda: A10G)
    plan_model(tmp_path, "encoder", tensorrt_version="10.0.0")
    (tmp_path / "pipeline" / "1").mkdir(parents=True)
    (tmp_path / "pipeline" / "config.pbtxt").write_text(
        'name: "pipeline"\nplatform: "ensemble"\n'
        'ensemble_scheduling { step [{ model_name: "encoder", model_version: -1 }] }\n'
    )
    with pytest.raises(RepositoryError, match=r"ERROR: model pipeline cannot be served on this host: encoder/1/"):
        refuse_unrunnable_plans(tmp_path, "pipeline")
    plan_model(tmp_path, "encoder")  # rebuilt for this runtime
    refuse_unrunnable_plans(tmp_path, "pipeline")


def test_mme_load_refuses_before_anything_is_staged_or_loaded(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorrt_check, "detect_runtime", lambda: A10G)
    root, managed = tmp_path / "models", tmp_path / "managed"
    managed.mkdir()
    url = plan_model(root / "m1", "model", tensorrt_version="10.0.0")

    def no_client():
        raise AssertionError("Triton was asked to load a plan that cannot run")

    mme = Settings(model_root=root, memory_reserve_bytes=0, max_concurrent_loads=1)
    registry = ModelRegistry(mme, managed, no_client)  # type: ignore[arg-type]
    body = f'{{"model_name": "m1", "url": "{url}"}}'.encode()
    with pytest.raises(BadRequest, match=r"model 'm1' cannot be loaded on this host: model/1/model.plan: plan built"):
        asyncio.run(registry.load(body, None))
    assert registry.records == {}
    assert list(managed.iterdir()) == []
