"""The command line ServeContainer gives docker or podman (the image tests run it for real)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from smtriton.local.serve_process import Mount, ServeContainer, container_engine


def test_the_image_runs_as_sagemaker_runs_it_on_loopback_with_room_in_dev_shm(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    # `true` stands in for the engine: it takes any arguments and exits at once.
    container = ServeContainer(
        "smtriton:cpu",
        tmp_path / "log",
        engine="true",
        env={"SAGEMAKER_MULTI_MODEL": "true"},
        mounts=[Mount(repo, "/opt/ml/models")],
        port=8123,
        user="1000:1000",
        read_only=True,
    )
    assert container.stop(5) == 0
    argv = container.command
    assert argv[:2] == ["true", "run"]
    assert argv[-4:] == ["smtriton:cpu", "serve", "--host", "127.0.0.1"]
    pairs = set(itertools.pairwise(argv))
    assert {
        ("--network", "host"),
        ("--shm-size", "1g"),
        ("--env", "SAGEMAKER_BIND_TO_PORT=8123"),
        ("--env", "SAGEMAKER_MULTI_MODEL=true"),
        ("--mount", f"type=bind,source={repo.resolve()},target=/opt/ml/models,ro"),
        ("--user", "1000:1000"),
        ("--tmpfs", "/tmp:rw,exec,mode=1777"),
    } <= pairs
    assert "--rm" in argv
    assert "--read-only" in argv
    assert container.url == "http://127.0.0.1:8123"


def test_the_engine_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.setenv("SMTRITON_CONTAINER_ENGINE", "podman --runtime runc")
    assert container_engine() == ["podman", "--runtime", "runc"]
    assert container_engine("docker") == ["docker"]


def test_without_docker_or_podman_it_says_what_to_install(monkeypatch):
    monkeypatch.delenv("SMTRITON_CONTAINER_ENGINE", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(RuntimeError, match="install docker"):
        container_engine()


def test_a_writable_mount_drops_ro():
    assert Mount(Path("/data"), "/opt/ml/models", read_only=False).arg() == (
        "type=bind,source=/data,target=/opt/ml/models"
    )
