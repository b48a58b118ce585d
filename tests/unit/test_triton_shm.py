"""The Python backend's shared memory: each Triton's regions named so serve knows its own, and removed
once that Triton is gone."""

from __future__ import annotations

from smtriton.serve.settings import Settings
from smtriton.serve.triton import shm
from smtriton.serve.triton.installation import TritonInstallation
from smtriton.serve.triton.process import Ports, build_command
from smtriton.serve.triton.supervisor import TritonSupervisor


def test_every_serve_names_its_regions_apart_from_tritons_own_and_each_other():
    first, second = shm.new_prefix(), shm.new_prefix()
    assert first != second
    assert first.startswith(shm.TRITON_PREFIX)


def test_only_the_regions_of_the_prefix_are_removed(tmp_path):
    ours = shm.new_prefix()
    for name in (f"{ours}a1b2", f"{ours}c3d4"):
        (tmp_path / name).write_bytes(b"\0" * 1024)
    others = [f"{shm.new_prefix()}e5f6", f"{shm.TRITON_PREFIX}0f1e2d", "psm_12345"]
    for name in others:
        (tmp_path / name).write_bytes(b"\0" * 10)
    assert shm.remove_regions(ours, tmp_path) == 2048
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert shm.remove_regions(ours, tmp_path) == 0
    assert shm.remove_regions(ours, tmp_path / "missing") == 0


def test_a_prefix_the_deployment_set_is_its_own_and_left_alone(tmp_path):
    mine = "--backend-config=python,shm-region-prefix-name=mine_"
    assert shm.given_prefix([mine, "--log-verbose=1"]) == "mine_"
    assert shm.given_prefix(["--backend-config=python,shm-default-byte-size=1"]) is None
    # The option and its value in two words, as SAGEMAKER_TRITON_ADDITIONAL_ARGS may split them.
    assert shm.given_prefix(["--log-verbose=1", "--backend-config", "python,shm-region-prefix-name=two_"]) == "two_"
    assert shm.given_prefix(["--backend-config", "python,shm-default-byte-size=1"]) is None
    assert shm.given_prefix(["--backend-config", "onnxruntime,shm-region-prefix-name=x"]) is None
    assert shm.given_prefix(["--backend-config"]) is None
    split = Settings.from_env(
        {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--backend-config python,shm-region-prefix-name=two_"}
    )
    installation = TritonInstallation(binary=tmp_path / "tritonserver", backends=tmp_path)
    assert TritonSupervisor(split, installation, tmp_path, tmp_path).shm_prefix is None  # serve adds none of its own
    installation = TritonInstallation(binary=tmp_path / "tritonserver", backends=tmp_path)
    theirs = TritonSupervisor(Settings(triton={"additional_args": [mine]}), installation, tmp_path, tmp_path)
    assert theirs.shm_prefix is None  # nothing of theirs is removed
    ours = TritonSupervisor(Settings(), installation, tmp_path, tmp_path)
    assert ours.shm_prefix is not None
    command = build_command(installation, Settings(), tmp_path, tmp_path, Ports(http=1), (), ours.shm_prefix)
    assert f"--backend-config=python,shm-region-prefix-name={ours.shm_prefix}" in command


def _model(root, name: str, config: str):
    model = root / name
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(f'name: "{name}"\n' + config)
    return model


def test_the_instances_that_take_shared_memory_are_those_of_python_and_python_based_backends(tmp_path):
    native = {"python", "onnxruntime"}  # a Triton with a native ONNX Runtime, and no native PyTorch
    cases = {
        'backend: "python"\ninstance_group [{ kind: KIND_CPU, count: 3 }]': 3,
        'platform: "onnxruntime_onnx"\ninstance_group [{ kind: KIND_CPU, count: 3 }]': 0,  # native
        'platform: "pytorch_libtorch"\ninstance_group [{ kind: KIND_CPU, count: 2 }]': 2,  # Python-based here
        'backend: "pytorch"\ninstance_group [{ kind: KIND_GPU, count: 2 }]': 4,  # per GPU, two GPUs
        'backend: "pytorch"\ninstance_group [{ kind: KIND_GPU, count: 2, gpus: [0] }]': 2,
        'backend: "python"': 2,  # no group: one an available GPU
        'platform: "ensemble"': 0,
    }
    for i, (config, expected) in enumerate(cases.items()):
        assert shm.python_instances(_model(tmp_path, f"m{i}", config), native, gpus=2) == expected, config
    assert shm.python_instances(_model(tmp_path, "cpu", 'backend: "python"'), native, gpus=0) == 1
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.pbtxt").write_text("name: [")
    assert shm.python_instances(broken, native, gpus=0) == 0  # Triton says what is wrong with it


def test_a_shortfall_names_both_numbers_and_what_to_change(tmp_path):
    models = [_model(tmp_path, "p", 'backend: "python"\ninstance_group [{ kind: KIND_CPU, count: 4 }]')]
    free = shm.free_bytes(tmp_path)
    assert free is not None
    assert shm.shortfall(models, 1024, {"python"}, 0, tmp_path) is None  # 4 KiB: fits anywhere
    too_much = (free // 4 + 1) * 4  # four regions just past what is free
    problem = shm.shortfall(models, too_much, {"python"}, 0, tmp_path)
    assert problem is not None
    assert f"for 4 model instances ({too_much // shm.MIB} MiB each, SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE)" in problem
    assert shm.shortfall(models, too_much, {"python"}, 0, tmp_path / "missing") is None  # cannot tell: no refusal
