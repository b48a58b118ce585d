"""The tritonserver command line and backend directory `serve` builds."""

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from smtriton.serve.settings import Settings
from smtriton.serve.triton.access import HEADER, TritonAccess, restricted_by
from smtriton.serve.triton.backends import PYTHON_BASED, assemble_backends
from smtriton.serve.triton.installation import TritonInstallation
from smtriton.serve.triton.ports import pick_port
from smtriton.serve.triton.process import Ports, TritonProcess, build_command


def _installation(tmp_path: Path, native: tuple[str, ...], stub: bool) -> TritonInstallation:
    backends = tmp_path / "native"
    for name in native:
        (backends / name).mkdir(parents=True)
        (backends / name / f"libtriton_{name}.so").write_bytes(b"")
    stub_path = None
    if stub:
        stub_path = tmp_path / "stubs" / "triton_python_backend_stub"
        stub_path.parent.mkdir()
        stub_path.write_bytes(b"stub")
    return TritonInstallation(binary=tmp_path / "tritonserver", backends=backends, python_stub=stub_path)


def test_command_binds_loopback_only_with_explicit_model_control(tmp_path):
    inst = _installation(tmp_path, ("python",), stub=False)
    cmd = build_command(inst, Settings.from_env({}), Path("/repo"), Path("/b"), Ports(http=4321))
    assert "--http-address=127.0.0.1" in cmd
    assert "--http-port=4321" in cmd
    assert "--allow-grpc=false" in cmd
    assert "--allow-metrics=false" in cmd
    assert "--allow-sagemaker=false" in cmd
    assert "--model-control-mode=explicit" in cmd
    assert not any(arg.startswith("--load-model") for arg in cmd)


def test_the_sme_model_is_loaded_by_triton_as_it_starts(tmp_path):
    """Triton loads it while the front still imports its modules; its outcome is read, not asked again."""
    inst = _installation(tmp_path, ("python",), stub=False)
    settings = Settings.from_env({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--log-info=true"})
    cmd = build_command(inst, settings, Path("/repo"), Path("/b"), Ports(http=1), ("encoder",))
    assert [arg for arg in cmd if arg.startswith("--load-model")] == ["--load-model=encoder"]
    assert "--model-control-mode=explicit" in cmd
    assert cmd[-1] == "--log-info=true"  # the user's own arguments still come last


def test_grpc_and_metrics_bind_loopback(tmp_path):
    inst = _installation(tmp_path, ("python",), stub=False)
    settings = Settings.from_env({"SAGEMAKER_TRITON_ALLOW_METRICS": "true"})
    cmd = build_command(inst, settings, Path("/repo"), Path("/b"), Ports(http=1, grpc=2, metrics=3))
    assert {"--grpc-address=127.0.0.1", "--grpc-port=2", "--metrics-address=127.0.0.1", "--metrics-port=3"} <= set(cmd)


def test_sagemaker_variables_map_to_triton_flags(tmp_path):
    inst = _installation(tmp_path, ("python",), stub=False)
    settings = Settings.from_env(
        {
            "SAGEMAKER_TRITON_LOG_INFO": "false",
            "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "3",
            "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2048",
            "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--load-model=extra",
        }
    )
    cmd = build_command(inst, settings, Path("/repo"), Path("/b"), Ports(http=1))
    assert "--log-info=false" in cmd
    assert "--buffer-manager-thread-count=3" in cmd
    assert "--backend-config=python,shm-growth-byte-size=2048" in cmd
    assert cmd[-1] == "--load-model=extra"


def test_tritons_http_threads_grow_with_the_front_workers(tmp_path):
    inst = _installation(tmp_path, ("python",), stub=False)

    def threads(env: dict[str, str]) -> list[str]:
        cmd = build_command(inst, Settings.from_env(env), Path("/repo"), Path("/b"), Ports(http=1))
        return [arg for arg in cmd if arg.startswith("--http-thread-count")]

    assert threads({"SAGEMAKER_MODEL_SERVER_WORKERS": "4"}) == []  # Triton's own 8
    assert threads({"SAGEMAKER_MODEL_SERVER_WORKERS": "12"}) == ["--http-thread-count=12"]
    both = {"SAGEMAKER_MODEL_SERVER_WORKERS": "12", "SAGEMAKER_TRITON_THREAD_COUNT": "3"}
    assert threads(both) == ["--http-thread-count=3"]  # the variable wins


def test_backends_the_binary_lacks_are_filled_with_python_based_ones(tmp_path):
    inst = _installation(tmp_path, ("python",), stub=True)
    out = assemble_backends(inst, tmp_path / "assembled")
    for name in PYTHON_BASED:
        assert (out / name / "model.py").is_file()
    # The python backend is copied (Triton refuses libraries whose real path leaves the directory).
    assert (out / "python" / "libtriton_python.so").is_file()
    assert not (out / "python" / "libtriton_python.so").is_symlink()
    assert (out / "python" / "triton_python_backend_stub").read_bytes() == b"stub"


def test_native_backends_win_over_python_based_ones(tmp_path):
    inst = _installation(tmp_path, ("python", "onnxruntime"), stub=True)
    out = assemble_backends(inst, tmp_path / "assembled")
    assert (out / "onnxruntime").is_symlink()
    assert not (out / "onnxruntime" / "model.py").exists()
    assert (out / "pytorch" / "model.py").is_file()


def test_a_complete_native_installation_is_used_as_it_is(tmp_path):
    inst = _installation(tmp_path, ("python", "onnxruntime", "pytorch", "tensorrt"), stub=False)
    assert assemble_backends(inst, tmp_path / "assembled") == inst.backends
    assert not (tmp_path / "assembled").exists()


def test_ports_come_from_the_safe_range_and_skip_excluded(tmp_path):
    port = pick_port((40100, 40110), exclude={40100, 40101})
    assert 40102 <= port <= 40110
    assert pick_port(None, exclude=set()) > 0


def test_model_loading_configs_and_shared_memory_are_behind_a_value_drawn_at_each_start(tmp_path):
    inst = _installation(tmp_path, ("python",), stub=False)
    access = TritonAccess.new()
    assert access.key != TritonAccess.new().key
    assert access.key not in repr(access)
    cmd = build_command(inst, Settings.from_env({}), Path("/repo"), Path("/b"), Ports(http=1, grpc=2), access=access)
    wanted = f"model-repository,model-config,shared-memory,logging,trace:{HEADER}={access.key}"
    assert f"--http-restricted-api={wanted}" in cmd
    assert f"--grpc-restricted-protocol={wanted}" in cmd


def test_the_command_is_logged_without_the_value(caplog):
    access = TritonAccess.new()
    process = TritonProcess([sys.executable, "-c", "pass", *access.flags()], {}, access)

    async def run() -> None:
        await process.spawn()
        await process.wait()

    with caplog.at_level(logging.INFO, logger="serve.triton"):
        asyncio.run(run())
    assert "starting tritonserver" in caplog.text
    assert "<hidden>" in caplog.text
    assert access.key not in caplog.text


@pytest.mark.parametrize(
    ("args", "restricted"),
    [
        (["--http-restricted-api=model-repository,health:k=v"], ["model-repository"]),
        (["--grpc-restricted-protocol", "shared-memory,model-config:k=v"], ["shared-memory", "model-config"]),
        (["--http-restricted-api=health,statistics:k=v", "--log-info=true"], []),
        (["--http-restricted-api=trace:k=v"], ["trace"]),
        (["--grpc-restricted-protocol"], []),
    ],
)
def test_additional_args_that_restrict_serves_apis_are_found_in_either_form(args, restricted):
    assert restricted_by(args) == restricted


def test_serve_refuses_additional_args_that_restrict_its_apis_in_one_line(tmp_path):
    env = {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--http-restricted-api=model-repository:admin=x", "PATH": "/usr/bin"}
    code = "from smtriton.serve.owner.cli import main; main(['--model-repository', '.'])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "restricts Triton's model-repository API with a key of its own" in line
