"""scripts/gpu-proof.sh where it cannot prove anything: no Docker, no daemon, no GPU, no NGC access, no
container toolkit. Each step says why it cannot run (or why it failed) in one report line, the steps that
need it say so too, and the exit status tells a partial run (3) from a failure (1).

docker and nvidia-smi are small scripts here that answer as the real ones do on such hosts; the PATH the
script sees holds every other command of this host, never a real docker or nvidia-smi.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-proof.sh"
STEPS = ["docker", "gpu", "base", "toolkit", "build", "image", "convert", "gpu-tests"]
NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
UNAUTHORIZED = "Error response from daemon: unauthorized: authentication required"
NO_TOOLKIT = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'


def _host_path(tmp: Path) -> str:
    """A folder of links to every command on this PATH except docker and nvidia-smi."""
    farm = tmp / "host-bin"
    farm.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            link = farm / entry.name
            if entry.name not in ("docker", "nvidia-smi") and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(farm)


def _fake(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


def _docker(daemon: bool = True, pull: str = "", gpus: str = "", build: str = "") -> str:
    """A docker whose daemon answers (or not), whose pull, run --gpus and buildx build fail with the
    given message (or succeed), and which has no image yet."""
    return f"""
log() {{ echo "$*" >> "$FAKE_LOG"; }}
log "$@"
case "$1 $2" in
  "info "*) {"echo ok" if daemon else f"echo {shlex.quote(NO_DAEMON)} >&2; exit 1"} ;;
  "buildx version") echo "github.com/docker/buildx v0.20.0" ;;
  "buildx build") {f"echo {shlex.quote('ERROR: ' + build)} >&2; exit 1" if build else "exit 0"} ;;
  "version "*) echo "server 27.5.1" ;;
  "image inspect") exit 1 ;;
  "pull "*) {f"echo {shlex.quote(pull)} >&2; exit 1" if pull else "echo pulled"} ;;
  "run "*) {f"echo {shlex.quote(gpus)} >&2; exit 125" if gpus else "echo 'GPU 0: NVIDIA A10G (UUID: GPU-1)'"} ;;
  *) echo "fake docker: unexpected $*" >&2; exit 99 ;;
esac
"""


def _run(tmp: Path, fakes: dict[str, str]) -> tuple[int, dict[str, tuple[str, str]], str, list[str]]:
    fake_bin = tmp / "fake-bin"
    fake_bin.mkdir()
    for name, body in fakes.items():
        _fake(fake_bin, name, body)
    log = tmp / "docker-calls.log"
    log.touch()
    env = {
        "PATH": f"{fake_bin}{os.pathsep}{_host_path(tmp)}",
        "HOME": str(tmp),
        "WORK": str(tmp / "work"),
        "VENV": str(Path(sys.executable).parent.parent),  # set up already: scripts/setup.sh is not run
        "FAKE_LOG": str(log),
    }
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp)
    report = {}
    for line in done.stdout.splitlines():
        found = re.match(r"  (\S+)\s+(PASS|FAIL|CANNOT RUN)\s+(.*)$", line)
        if found:
            report[found.group(1)] = (found.group(2), found.group(3))
    output = done.stdout + done.stderr
    assert "Traceback" not in output
    assert not re.search(r"gpu-proof\.sh: line \d+", done.stderr), done.stderr  # no error of bash itself
    return done.returncode, report, output, log.read_text().splitlines()


def test_without_docker_or_a_gpu_every_step_says_why_and_the_run_is_partial(tmp_path):
    code, report, output, _ = _run(tmp_path, {})
    assert code == 3, output
    assert list(report) == STEPS
    assert report["docker"] == ("CANNOT RUN", "no docker command on this host (install Docker with the buildx plugin)")
    assert report["gpu"] == ("CANNOT RUN", "no NVIDIA driver on this host (nvidia-smi not found)")
    assert report["base"][1].startswith("needs docker: no docker command")
    assert report["toolkit"][1].startswith("needs gpu: no NVIDIA driver")
    for step in ("build", "image", "convert", "gpu-tests"):
        assert report[step] == report["base"]


def test_a_docker_daemon_that_does_not_answer_is_named(tmp_path):
    code, report, output, calls = _run(tmp_path, {"docker": _docker(daemon=False)})
    assert code == 3, output
    assert report["docker"] == ("CANNOT RUN", f"the Docker daemon does not answer: {NO_DAEMON}")
    assert report["build"] == ("CANNOT RUN", f"needs docker: the Docker daemon does not answer: {NO_DAEMON}")
    assert calls == ["info"]  # nothing else was tried


def test_no_gpu_and_no_ngc_access_stop_before_anything_is_built(tmp_path):
    nvidia_smi = f"echo {shlex.quote(NO_DRIVER)}\nexit 9\n"
    code, report, output, calls = _run(
        tmp_path, {"docker": _docker(pull=UNAUTHORIZED), "nvidia-smi": nvidia_smi}
    )  # fmt: skip
    assert code == 3, output
    assert report["docker"] == ("PASS", "server 27.5.1")
    assert report["gpu"] == ("CANNOT RUN", f"no NVIDIA GPU 0: {NO_DRIVER}")
    status, detail = report["base"]
    assert status == "CANNOT RUN"
    assert re.fullmatch(r"cannot pull nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3 \(NGC: docker login nvcr\.io .*\): "
                        + re.escape(UNAUTHORIZED), detail), detail  # fmt: skip
    assert report["toolkit"][1].startswith("needs gpu: no NVIDIA GPU 0")
    assert report["build"][1].startswith("needs base: cannot pull")
    assert report["convert"] == report["build"]  # the cause at the root, not the chain of steps
    assert not [c for c in calls if c.startswith(("buildx build", "run"))]


def test_a_gpu_docker_cannot_hand_to_containers_is_a_failure_and_the_build_is_reported(tmp_path):
    """The base is there and the GPU too, but docker has no NVIDIA runtime: the toolkit step fails; the build
    still runs (through smtriton build-image), and its failure is reported with its last line."""
    nvidia_smi = 'echo "GPU 0: NVIDIA A10G (UUID: GPU-1234)"\n'
    code, report, output, calls = _run(
        tmp_path,
        {"docker": _docker(gpus=NO_TOOLKIT, build="failed to solve: base image not found"), "nvidia-smi": nvidia_smi},
    )
    assert code == 1, output
    assert report["gpu"] == ("PASS", "GPU 0: NVIDIA A10G")
    assert report["base"][0] == "PASS"
    status, detail = report["toolkit"]
    assert status == "FAIL"
    assert "is the NVIDIA container toolkit installed?" in detail
    assert detail.endswith(NO_TOOLKIT)
    status, detail = report["build"]
    assert status == "FAIL"
    assert "failed to solve: base image not found" in detail
    assert report["image"] == ("CANNOT RUN", "needs build, which failed")
    assert report["convert"] == ("CANNOT RUN", "needs build, which failed")
    build = next(c for c in calls if c.startswith("buildx build"))
    assert "--target triton" in build
    assert re.search(r"--build-arg BASE_IMAGE=nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3", build)


@pytest.mark.parametrize("args", [["--help"], ["a", "b"]])
def test_usage(tmp_path, args):
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "bash scripts/gpu-proof.sh [BASE_IMAGE]" in done.stderr
