"""Every example in README.md runs as a user would run it: executed here, or marked in the README as
covered by a named test or script (``<!-- example covered by: PATH[::TEST], ... -->`` before the block).
Every `smtriton` and `serve` command line of README.md and docs/ names commands and flags that exist."""

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
            # The one line that says "ready" is serve's, as the README says: nothing earlier says it.
            said = [line for line in (tmp_path / "demo.log").read_text().splitlines() if re.search(r"\bready\b", line)]
            assert len(said) == 1, said
            assert said[0].endswith("model text_encoder is ready"), said
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


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCED = re.compile(r"```\w*\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`((?:\.venv/bin/)?(?:smtriton|serve) [^`\n]+)`(?!`)")
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*((?:\.venv/bin/)?(?:smtriton|serve)\s.*)")


def command_lines(text: str) -> Iterator[str]:
    """The `smtriton` and `serve` command lines of a page: in its code blocks, and its inline code."""
    for block in FENCED.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            if m := COMMAND.match(line.strip()):
                yield m.group(1)
    yield from INLINE.findall(text)


def mistakes(line: str) -> list[str]:
    """What a command line gets wrong: commands and flags its program lacks, required options it leaves out
    (but in a line that elides with "...", or names a command or one of its flags in prose)."""
    from typer.main import get_command

    from smtriton.serve.owner import cli as serve_cli

    words = shlex.split(line, comments=True)
    program = words.pop(0).rsplit("/", 1)[-1]
    flags = [re.sub(r"[\[\]]", "", w).split("=")[0] for w in words if w.lstrip("[").startswith("-") and w != "-"]
    if program == "serve":
        known = {s for action in serve_cli.parser()._actions for s in action.option_strings}
        return [flag for flag in flags if flag not in known]
    command = group = get_command(app)
    context = group.make_context("smtriton", ["--help"], resilient_parsing=True)
    while hasattr(command, "get_command") and words and not words[0].startswith("-"):
        sub = command.get_command(context, words[0])
        if sub is None:
            return [words[0]]
        command = sub
        words.pop(0)
    if hasattr(command, "get_command"):
        return []  # a group named on its own, in prose
    options = [p for p in command.params if getattr(p, "param_type_name", "") == "option"]
    known = {s for p in command.params for s in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    wrong = [flag for flag in flags if flag not in known]
    if len(words) > 1 and "..." not in line:
        wrong += [f"missing {p.opts[0]}" for p in options if p.required and not set(p.opts) & set(flags)]
    return wrong


def test_every_command_line_in_the_docs_names_real_commands_and_flags():
    lines = 0
    for doc in DOCS:
        for line in command_lines(doc.read_text()):
            assert not mistakes(line), f"{doc.relative_to(ROOT)}: {line}: {mistakes(line)}"
            lines += 1
    assert lines > 100
    assert mistakes("smtriton convert onnx my_recipe.toml -m encoder -o repo [--simplify]") == []
    assert mistakes("smtriton convert onnx -m encoder -o repo --fp32") == ["--fp32"]
    assert mistakes("smtriton convert onnx -m text_encoder") == ["missing --output"]
    assert mistakes("smtriton convert keras model.h5") == ["keras"]
    assert mistakes("serve --model-repository DIR [--threads 4]") == ["--threads"]


def test_running_serve_says_a_single_model_endpoint_loads_only_its_default_model():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Running `serve`", 1)[1].split("\n## ", 1)[0]
    said = " ".join(section.split())
    assert "A single-model endpoint loads only its default model" in said
    assert "`SMTRITON_LOAD_MODELS`" in said


def test_records_are_answered_as_tritons_batching_computes_them_not_as_alone():
    """A model that computes a batch may give a record other float bits than a lone request: no page
    promises a multi-record answer "as it would be alone"."""
    for doc in DOCS:
        said = " ".join(doc.read_text().split())
        assert "as it would be alone" not in said, doc.name
    for page in ("contract.md", "operations.md"):
        assert "as Triton's own batching computes it" in " ".join((ROOT / "docs" / page).read_text().split())


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
