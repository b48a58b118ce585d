"""What a newcomer meets first: the set-up script says what it is doing, and the package builds quietly
into one import name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python3: `--version`, `-m venv DIR` (a venv whose python records what pip is asked).
if [[ "$1" == "--version" ]]; then echo "Python 3.11.0"; exit 0; fi
mkdir -p "$3/bin"
printf '#!/usr/bin/env bash\\necho "$*" >> "%s"\\n' "$CALLS" > "$3/bin/python"
chmod +x "$3/bin/python"
"""


# The same, but its venv's python fails `-c ...` (torchvision's import check): PyPI's CUDA torchvision.
FAKE_PYTHON_NO_TORCHVISION = FAKE_PYTHON.replace(
    'printf \'#!/usr/bin/env bash\\necho "$*" >> "%s"\\n\'',
    'printf \'#!/usr/bin/env bash\\necho "$*" >> "%s"\\n[[ $1 == -c ]] && exit 1\\nexit 0\\n\'',
)


def _fake_setup_env(tmp_path: Path) -> dict[str, str]:
    """scripts/setup.sh's environment with FAKE_PYTHON as its Python: every pip call lands in ``CALLS``."""
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "VENV": str(tmp_path / "venv"), "CALLS": str(tmp_path / "calls")}
    env.pop("TORCH_INDEX_URL", None)
    return env


def test_setup_announces_each_step_and_when_it_is_done(tmp_path):
    env = _fake_setup_env(tmp_path)
    calls = tmp_path / "calls"
    run = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    steps = [line for line in run.stderr.splitlines() if line.startswith("setup [")]
    assert [s.split("]")[0] for s in steps] == ["setup [1/4", "setup [2/4", "setup [3/4", "setup [4/4"]
    assert "installing PyTorch" in steps[2]
    assert run.stderr.rstrip().endswith(f"setup done: {tmp_path / 'venv'}")
    assert "-c requirements-dev.lock -e .[local,convert,test]" in calls.read_text()
    again = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stderr) == (0, "")  # up to date: nothing to say, nothing done


@pytest.mark.parametrize("local_wheel", [True, False], ids=["local-cpu-wheel", "none-here"])
def test_setup_installs_the_cpu_build_of_torch_never_pypis_cuda_one(tmp_path, local_wheel):
    """The first run's biggest download: PyTorch's CPU build (from a local wheel where one lies, else from
    PyTorch's CPU index), not PyPI's Linux build with its GBs of CUDA libraries."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    if local_wheel:
        (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    calls = tmp_path / "calls"
    env = _fake_setup_env(tmp_path) | {"WHEELS": str(wheels)}
    run = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    (torch_call,) = [c for c in calls.read_text().splitlines() if c.endswith(" torch")]
    assert f"--find-links {wheels}" in torch_call
    assert ("--extra-index-url https://download.pytorch.org/whl/cpu" in torch_call) is not local_wheel
    assert "-c requirements-dev.lock" in torch_call


@pytest.mark.parametrize("local_wheels", [True, False], ids=["local-cpu-wheels", "none-here"])
def test_setup_torchvision_installs_the_cpu_build_beside_the_cpu_torch(tmp_path, local_wheels):
    """`setup.sh --torchvision`: torch and torchvision in one pip call, from the local CPU wheels where both
    lie, else from PyTorch's CPU index (PyPI's Linux torchvision is built for CUDA torch and fails to
    import beside the CPU one), under the lock's torch; then torchvision must import."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    if local_wheels:
        (wheels / "torchvision-0.28.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    calls = tmp_path / "calls"
    env = _fake_setup_env(tmp_path) | {"WHEELS": str(wheels)}
    run = subprocess.run(
        ["bash", "scripts/setup.sh", "--torchvision"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert "setup [3/4] installing PyTorch and torchvision (CPU builds" in run.stderr
    recorded = calls.read_text().splitlines()
    (torch_call,) = [c for c in recorded if c.endswith(" torch torchvision")]
    assert torch_call.startswith("-m pip install ")
    assert f"--find-links {wheels}" in torch_call
    assert ("--extra-index-url https://download.pytorch.org/whl/cpu" in torch_call) is not local_wheels
    assert "-c requirements-dev.lock" in torch_call
    assert recorded.index("-c import torchvision") == recorded.index(torch_call) + 1
    plain = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "installing PyTorch (CPU build" in plain.stderr  # another set-up than the last: it runs
    refused = subprocess.run(["bash", "scripts/setup.sh", "--vision"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert (refused.returncode, refused.stderr) == (
        2,
        "error: unknown option --vision (bash scripts/setup.sh --help)\n",
    )


def test_setup_stops_in_one_line_when_torchvision_does_not_import(tmp_path):
    """PyTorch's index out of reach: pip takes PyPI's torchvision, which does not import; set-up says so."""
    env = _fake_setup_env(tmp_path)
    (tmp_path / "python3").write_text(FAKE_PYTHON_NO_TORCHVISION)
    run = subprocess.run(
        ["bash", "scripts/setup.sh", "--torchvision"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1].startswith("error: torchvision does not import beside this torch")
    assert not (tmp_path / "venv" / ".smtriton-setup").exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to copy the tracked tree")
def test_the_wheel_holds_only_the_smtriton_namespace_and_builds_without_deprecation_banners(tmp_path):
    source = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.split():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--disable-pip-version-check"]
    build = subprocess.run(
        [*pip, "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    assert "deprecated" not in (build.stdout + build.stderr).lower()  # setuptools' banners, with -v
    (wheel,) = tmp_path.glob("smtriton-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"smtriton", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert "smtriton-0.1.0.dist-info/licenses/LICENSE" in zipfile.ZipFile(wheel).namelist()


def _demo_sandbox(tmp_path: Path) -> Path:
    """scripts/demo.sh beside stand-ins: a set-up and a build that do nothing, a serve that prints its arguments."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for name, body in (("smtriton", "exit 0"), ("serve", 'printf "%s\\n" "$@"')):
        (tmp_path / ".venv" / "bin" / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (tmp_path / ".venv" / "bin" / name).chmod(0o755)
    return tmp_path / "scripts" / "demo.sh"


@pytest.mark.parametrize(("host", "bound"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_the_demo_listens_on_loopback_unless_asked(tmp_path, host, bound):
    """The demo is for this machine: 127.0.0.1 by default; HOST=0.0.0.0 opens it to the network."""
    demo = _demo_sandbox(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "DEMO_MODEL")}
    if host is not None:
        env["HOST"] = host
    run = subprocess.run(["bash", str(demo)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    args = run.stdout.split()
    assert args[args.index("--host") + 1] == bound
    assert args[args.index("--port") + 1] == "8080"


def test_nothing_the_demo_prints_before_serve_says_ready(tmp_path):
    """A newcomer waits for "ready": the set-up (with work to do), the build and the demo's own line never
    say it, so the first line that does is serve's `model NAME is ready`."""
    demo = _demo_sandbox(tmp_path)
    for name in ("pyproject.toml", "requirements-dev.lock"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copy2(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    env = _fake_setup_env(tmp_path) | {"VENV": ".venv"}
    env = {k: v for k, v in env.items() if k not in ("HOST", "PORT", "DEMO_MODEL")}
    run = subprocess.run(["bash", str(demo)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    printed = run.stderr.splitlines()
    assert printed[0].startswith("setup [1/4]"), printed  # the set-up had work to do
    assert not [line for line in printed if "ready" in line.lower()], printed
    assert printed[-1].startswith("demo: starting serve for text_encoder on http://127.0.0.1:8080;"), printed
    from smtriton.serve.owner import endpoint

    assert 'log.info("model %s is ready' in Path(endpoint.__file__).read_text()  # the line the README quotes
    assert "`model text_encoder is ready`" in (ROOT / "README.md").read_text()
