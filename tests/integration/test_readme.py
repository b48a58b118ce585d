"""Every example in README.md runs as a user would run it: executed here, or marked in the README as
covered by a named test or script (``<!-- example covered by: PATH[::TEST], ... -->`` before the block)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from smtriton.cli import app
from smtriton.convert.build import build_repository
from smtriton.convert.recipe import DEFAULT_RECIPE
from smtriton.local.serve_process import free_port
from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, no_aws_environment
from tests.integration.test_local_endpoint import Emulator

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(?:<!-- example covered by: (?P<covered>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
# The examples this file runs, by their first words, and the test that runs each.
EXECUTED = {
    "bash scripts/demo.sh": "test_the_quick_start_demo_script_serves_the_demo",
    "curl -s http://localhost:8080/ping": "test_the_quick_start_requests",
    "import numpy as np, requests, tritonclient": "test_the_quick_start_requests",
    "smtriton build-repository": "test_the_conversion_examples",
    "serve --model-repository DIR": "test_the_serve_synopsis",
    "source .venv/bin/activate": "test_the_activation_line_gives_every_command_the_readme_uses",
}
MY_RECIPE = """
[[model]]
name = "encoder"
format = "onnx"
factory = "tests.integration.test_convert_cli:tiny"
max_batch_size = 4
input = [{ name = "ids", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 50] },
         { name = "scale", dtype = "FP32", shape = ["batch", 1] }]
output = [{ name = "scores" }]
axes = { sequence = [3] }

[[model]]
name = "encoder_ts"
format = "torchscript"
factory = "tests.integration.test_convert_cli:tiny"
max_batch_size = 4
input = [{ name = "INPUT__0", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 50] },
         { name = "INPUT__1", dtype = "FP32", shape = ["batch", 1] }]
output = [{ name = "OUTPUT__0" }]
axes = { sequence = [3] }
"""


@dataclass(frozen=True)
class Example:
    lang: str
    body: str
    covered: tuple[str, ...]


def examples() -> list[Example]:
    """The README's code blocks (a block without a language is a diagram or a listing, not an example)."""
    found = []
    for m in BLOCK.finditer((ROOT / "README.md").read_text()):
        if m.group("lang"):
            covered = tuple(c.strip() for c in (m.group("covered") or "").split(",") if c.strip())
            found.append(Example(m.group("lang"), m.group("body"), covered))
    return found


def example(first_words: str) -> str:
    (body,) = [e.body for e in examples() if e.body.startswith(first_words)]
    return body


def test_every_example_is_executed_or_names_what_covers_it():
    for e in examples():
        for reference in e.covered:
            path, _, test = reference.partition("::")
            assert (ROOT / path).is_file(), f"README names {path}, which does not exist"
            if test:
                assert f"def {test}(" in (ROOT / path).read_text(), f"README names {reference}, which does not exist"
        if not e.covered:
            assert any(e.body.startswith(words) for words in EXECUTED), f"no test runs this README example:\n{e.body}"
    for words in EXECUTED:
        assert any(e.body.startswith(words) for e in examples()), f"README has no example starting {words!r} any more"


def _command(line: str) -> list[str]:
    """A README command line as argv: [--optional] parts included, except those that need AWS."""
    line = re.sub(r"(?<=\s)\[(--[^\[\]]*)\]", lambda m: "" if "s3://" in m.group(1) else m.group(1), line)
    return shlex.split(line, comments=True)


@pytest.fixture(scope="module")
def text_encoder_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding the demo text encoder (built if needed; a no-op when up to date)."""
    report = build_repository(DEFAULT_RECIPE, models=["text_encoder"])
    assert [r.status for r in report.results] != ["failed"], report.results
    repo = tmp_path_factory.mktemp("readme") / "repo"
    repo.mkdir()
    (repo / "text_encoder").symlink_to(report.output / "text_encoder", target_is_directory=True)
    return repo


@pytest.fixture(scope="module")
def text_encoder(text_encoder_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path_factory.mktemp("readme-serve"), text_encoder_repository, "text_encoder")
    yield server
    server.stop()


def test_the_quick_start_demo_script_serves_the_demo(tmp_path: Path):
    """`bash scripts/demo.sh` as the README's first block runs it (on a free port): set-up (a no-op when
    .venv is current), the demo repository built (skipped when up to date), serve answering /ping and the
    text encoder, then a clean stop on SIGTERM."""
    import signal
    import time

    import requests

    block = example("bash scripts/demo.sh")
    demo = shlex.split(block.splitlines()[0], comments=True)
    assert demo == ["bash", "scripts/demo.sh"]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    env |= {"PORT": str(port), "SMTRITON_WORK_DIR": str(tmp_path / "work")}
    with (tmp_path / "demo.log").open("wb") as log:
        proc = subprocess.Popen(demo, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 900  # a set-up that has work to do, then seven models to build
            while True:
                assert proc.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "demo.log").read_text()[-3000:]
                try:
                    if requests.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.5)
            curl = example(next(w for w in EXECUTED if w.startswith("curl")))
            done = subprocess.run(["bash", "-c", curl.replace("http://localhost:8080", f"http://127.0.0.1:{port}")],
                                  capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
            assert done.stdout.startswith("200\n"), done.stdout
            assert '"name":"pooler_output"' in done.stdout
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_the_quick_start_requests(text_encoder: ServeProcess):
    curl = example(next(w for w in EXECUTED if w.startswith("curl")))
    done = subprocess.run(
        ["bash", "-c", curl.replace("http://localhost:8080", text_encoder.url)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.startswith("200\n"), done.stdout
    assert '"name":"pooler_output"' in done.stdout

    python = example(next(w for w in EXECUTED if w.startswith("import")))
    done = subprocess.run(
        [sys.executable, "-c", python.replace("http://localhost:8080", text_encoder.url)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "(1, 128)"


def test_the_conversion_examples(tmp_path: Path):
    (tmp_path / "model_repository").mkdir()
    (tmp_path / "model_repository" / "recipe.toml").write_text(DEFAULT_RECIPE.read_text())
    (tmp_path / "my_recipe.toml").write_text(MY_RECIPE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for line in example("smtriton build-repository").splitlines():
        argv = _command(line)
        assert argv[0] == "smtriton"
        done = subprocess.run(
            [sys.executable, "-c", "from smtriton.cli import main; main()", *argv[1:]],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "model.tar.gz").is_file()
    assert sorted(p.name for p in (tmp_path / "archives").glob("*.tar.gz")) == ["encoder.tar.gz", "encoder_ts.tar.gz"]
    assert "max_batch_size: 16" in (tmp_path / "repo" / "encoder" / "config.pbtxt").read_text()


def test_the_serve_synopsis(text_encoder_repository: Path, tmp_path: Path):
    port = free_port()
    (line,) = example("serve --model-repository DIR").splitlines()
    line = line.replace("DIR", str(text_encoder_repository)).replace("NAME", "text_encoder").replace(" N]", " 1]")
    argv = _command(line.replace("8080", str(port)).replace("0.0.0.0", "127.0.0.1"))
    assert argv[0] == "serve"
    server = ServeProcess(None, None, tmp_path / "serve.log", args=argv[1:])
    try:
        server.port, server.url = port, f"http://127.0.0.1:{port}"  # the README's --port comes last and wins
        server.wait_healthy()
    finally:
        server.stop()


def test_the_invoke_example_against_a_local_endpoint(text_encoder_repository: Path, tmp_path: Path):
    """The README's `smtriton invoke` line: a model with an INT64 and an INT32 input, from the command line."""
    (line,) = [line for line in example("smtriton build-image").splitlines() if line.startswith("smtriton invoke")]
    emulator = Emulator(tmp_path, ["--model-data", str(text_encoder_repository), "--endpoint-name", "demo"])
    try:
        env = {"AWS_ENDPOINT_URL": emulator.url, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
               "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
        result = CliRunner().invoke(app, _command(line)[1:], env=env)
    finally:
        emulator.stop()
    assert result.exit_code == 0, result.output
    assert "pooler_output" in result.stdout
    assert "[1, 128]" in result.stdout
    assert np.dtype("float32").name in result.stdout


def test_the_activation_line_gives_every_command_the_readme_uses(tmp_path: Path):
    """From a plain shell (the project's environment nowhere on PATH), the README's activation line is
    what makes its `smtriton`, `serve` and Python lines work; without it they fail."""
    (line,) = example("source .venv/bin/activate").splitlines()
    venv = Path(sys.prefix)  # the environment this test runs in: the README's .venv under scripts/test.sh
    plain = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    plain["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(venv)))
    uses = "smtriton --version && serve --version && python -c 'import tritonclient.http, boto3, numpy'"
    before = subprocess.run(["bash", "-c", uses], cwd=tmp_path, env=plain, capture_output=True, text=True, timeout=60)
    assert before.returncode != 0  # what a plain shell meets
    activated = line.replace(".venv/", f"{venv}/")
    done = subprocess.run(["bash", "-c", f"{activated} && {uses}"], cwd=tmp_path, env=plain, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("smtriton "), done.stdout


def test_the_local_invoke_example_needs_no_aws_configuration(text_encoder_repository: Path, tmp_path: Path):
    """The README's local-endpoint and invoke lines, as written, where AWS was never set up."""
    serve_line, invoke_line = example(
        "smtriton local-endpoint --model-data model_repository --default-model text_encoder"
    ).splitlines()
    args = _command(serve_line)[2:]
    del args[args.index("--port") : args.index("--port") + 2]  # the emulator picks a free one
    args[args.index("model_repository")] = str(text_encoder_repository)
    emulator = Emulator(tmp_path, args)
    try:
        argv = _command(invoke_line.replace("http://127.0.0.1:8090", emulator.url))
        assert argv[:2] == ["smtriton", "invoke"]
        done = subprocess.run([str(Path(sys.executable).parent / "smtriton"), *argv[1:]], capture_output=True,
                              text=True, timeout=120, env=no_aws_environment(tmp_path / "home"))  # fmt: skip
    finally:
        emulator.stop()
    assert done.returncode == 0, done.stderr
    assert "pooler_output" in done.stdout
    assert "[1, 128]" in done.stdout
