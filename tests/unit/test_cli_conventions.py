"""Both programs as a newcomer meets them: help on every command, one-line errors, versions, order, speed."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from smtriton import cli
from smtriton.aws.invoke_cli import parse_input
from smtriton.serve.owner import cli as serve_cli
from smtriton.serve.settings import known_variables
from tests.unit.test_perf_cli import NO_AWS
from tests.unit.test_repo_validate import tiny_onnx

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ["convert", "build-repository", "config", "validate", "package", "build-image", "push-image", "deploy",
            "invoke", "transform", "capture", "delete-endpoint", "local-endpoint", "local-transform", "perf",
            "tune"]  # fmt: skip


def smtriton(*args: object) -> typer.testing.Result:
    return CliRunner().invoke(cli.app, [str(a) for a in args])


def _command_paths() -> list[tuple[str, ...]]:
    """Every command and group of `smtriton`, as the words a user types."""
    group = get_command(cli.app)
    ctx = group.make_context("smtriton", ["--help"], resilient_parsing=True)
    paths: list[tuple[str, ...]] = [()]
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        paths.append((name,))
        for sub in getattr(command, "commands", {}):
            paths.append((name, sub))
    return paths


COMMANDS = _command_paths()


def test_every_command_is_reached():
    assert {path[0] for path in COMMANDS if path} == set(WORKFLOW)
    assert ("convert", "onnx") in COMMANDS
    assert ("package", "mme") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "smtriton")
@pytest.mark.parametrize("option", ["--help", "-h"])
def test_every_smtriton_command_has_readable_help(path, option):
    result = smtriton(*path, option)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    # Metavars read like the value; a default is one a user can type, not a path inside this checkout.
    assert not re.search(r"<(list\[|bool>)", result.output), result.output
    assert str(ROOT) not in result.output.replace("\n", "").replace("│", "")


def serve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`serve ARGS` as a user runs it: (exit status, stdout, stderr); only for what exits before serving."""
    with pytest.raises(SystemExit) as exited:
        serve_cli.main(list(args))
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


@pytest.mark.parametrize("option", ["--help", "-h"])
def test_serve_help_shows_defaults_and_the_environment_it_reads(option, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = serve(capsys, option)
    assert status == 0, out
    text = " ".join(out.split())
    assert "Default: 8080; overrides SAGEMAKER_BIND_TO_PORT" in text
    assert "Default: /opt/ml/model; overrides SMTRITON_MODEL_REPOSITORY" in text
    assert "<bool>" not in text
    schema_variables = known_variables() - {"SAGEMAKER_TRITON_ALLOW_GRPC"}  # without effect: not read
    assert all(name in text for name in schema_variables), sorted(n for n in schema_variables if n not in text)


def test_every_serve_option_says_what_the_option_does(capsys, monkeypatch):
    """An option's help describes the option, not its variable's values (a flag takes no `true`)."""
    monkeypatch.setenv("COLUMNS", "400")
    out = " ".join(serve(capsys, "--help")[1].split())
    helps = dict(re.findall(r" (--[a-z-]+)(?: [A-Z]+)? ([A-Z].*?)(?= --[a-z-]+ | Reads these)", out))
    assert set(helps) >= {"--multi-model", "--model-repository", "--log-level", "--port"}
    for option, text in helps.items():
        assert not re.search(r"\b(exactly|true)\b", text, re.I), (option, text)
    assert helps["--multi-model"].startswith("Serve a multi-model endpoint"), helps["--multi-model"]
    assert helps["--log-level"].startswith("Log level"), helps["--log-level"]
    assert "only its default model is loaded" in helps["--model-repository"]
    assert "SMTRITON_LOAD_MODELS" in helps["--model-repository"]


@pytest.mark.parametrize("path", [(), ("convert",), ("package",)])
def test_a_group_without_a_command_prints_its_help(path):
    result = smtriton(*path)
    assert result.exit_code == 2
    assert "Usage" in result.stdout
    assert "error" not in result.stderr


def test_both_programs_print_their_version(capsys):
    version = cli.distribution_version()
    assert smtriton("--version").output.strip() == f"smtriton {version}"
    assert serve(capsys, "--version")[:2] == (0, f"serve (smtriton) {version}\n")


def test_commands_are_listed_in_workflow_order():
    text = smtriton("--help").output.split("Commands", 1)[1]  # the list, not the help's paragraphs
    positions = [text.index(f" {name} ") for name in WORKFLOW]
    assert positions == sorted(positions)


def test_help_imports_no_heavy_module():
    """`smtriton --help` stays fast: the web framework, torch, ONNX and AWS load only when a command runs."""
    probe = (
        "import sys\nfrom smtriton.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('fastapi', 'uvicorn', 'torch', 'onnx', 'onnxruntime', 'boto3', 'tritonclient', 'google.protobuf')\n"
        "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT, check=True
    )
    assert done.stderr.strip().splitlines()[-1] == "[]"


# --- issue 15.3: every error one line with what to change; exit 2 for usage, 1 for failures --------


@pytest.fixture
def onnx_model(tmp_path: Path) -> Path:
    model = tmp_path / "repo" / "scorer"
    (model / "1").mkdir(parents=True)
    tiny_onnx(model / "1" / "model.onnx")
    return model


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--instance-kind", "GPU"], ["KIND_GPU", "KIND_CPU", "KIND_AUTO"]),
        (["--max-queue-delay-us", "-5"], ["--max-queue-delay-us", "greater than or equal to 0"]),
        (["--max-batch-size", "-1"], ["--max-batch-size", "greater than or equal to 0"]),
        (["--preferred-batch-size", "0"], ["--preferred-batch-size", "greater than or equal to 1"]),
        (["--bogus"], ["No such option", "--bogus"]),
    ],
)
def test_config_usage_errors_are_one_line_naming_the_accepted_values(onnx_model, args, words):
    result = smtriton("config", onnx_model, "--stdout", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert all(word in line for word in words), line


def test_config_accepts_an_instance_kind(onnx_model):
    result = smtriton("config", onnx_model, "--stdout", "--instance-kind", "KIND_GPU")
    assert result.exit_code == 0, result.output
    assert "kind: KIND_GPU" in result.stdout


def test_an_unknown_backend_parameter_is_a_warning_naming_the_known_ones(onnx_model):
    result = smtriton(
        "config", onnx_model, "--stdout", "--parameter", "BOGUS=1", "--parameter", "intra_op_thread_count=2"
    )
    assert result.exit_code == 0, result.output
    (warning,) = result.stderr.strip().splitlines()
    assert warning.startswith("warning: parameter 'BOGUS'")
    assert "intra_op_thread_count" in warning
    assert 'key: "BOGUS"' in result.stdout  # still written: the user may know a backend this tool does not


def test_a_factory_that_cannot_be_imported_is_a_one_line_usage_error(tmp_path):
    result = smtriton("convert", "onnx", "--factory", "no_such_module_anywhere:make", "-o", tmp_path,
                      "--input", "x:FP32:batch,4", "--output-tensor", "y", "--max-batch-size", "2")  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert "no_such_module_anywhere" in line


@pytest.mark.parametrize("args", [("--port", "x"), ("--bogus",), ("predict",)])
def test_serve_usage_error_is_one_line(capsys, args):
    status, _, err = serve(capsys, *args)
    assert status == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ")
    assert line.endswith("(see serve --help)")
    assert args[0] in line


# --- issue 15.1: nothing reports success for a config Triton would refuse ---------------------------------


def test_config_validates_what_it_wrote_before_reporting_success(onnx_model):
    """A description that disagrees with the artifact is written (the user asked for it) but is no ✓."""
    result = smtriton("config", onnx_model, "--input", "x:FP32:-1,5", "--output-tensor", "y:FP32:-1,2")
    assert result.exit_code == 1, result.output
    assert "✓" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    config = onnx_model / "config.pbtxt"
    assert last.startswith(f"error: written, but Triton would refuse {config}: input 'x': config dims [-1, 5] differ")
    assert smtriton("config", onnx_model, "--force").exit_code == 0  # from the artifact's signature: valid


# --- issue 15.6: the validator's edge cases -----------------------------------------------------------


def test_validate_names_a_missing_path_as_given(tmp_path):
    missing = tmp_path / "nonexistent"
    result = smtriton("validate", missing)
    assert result.exit_code == 1
    assert f"{missing}: error: no such directory" in result.stdout


@pytest.mark.parametrize("with_config", [True, False], ids=["config", "converted-without-config"])
def test_a_model_directory_where_a_repository_belongs_is_one_message_from_every_command(onnx_model, with_config):
    """validate, package sme and package mme: the same line, naming the parent to give instead."""
    if with_config:
        assert smtriton("config", onnx_model).exit_code == 0
    expected = (
        f"error: {onnx_model} is a model directory (config.pbtxt, version folders), not a model repository "
        f"(one directory per model): give its parent, {onnx_model.parent.resolve()}"
    )
    out = onnx_model.parent.parent
    commands = {("validate",): [], ("package", "sme"): ["-o", out / "m.tar.gz"], ("package", "mme"): ["-o", out / "a"]}
    for words, options in commands.items():
        result = smtriton(*words, onnx_model, *options)
        assert result.exit_code == 2, (words, result.output)
        assert result.stdout == ""
        assert result.stderr.strip().splitlines() == [expected], words
    assert not (out / "m.tar.gz").exists()


def test_a_repository_where_a_model_directory_belongs_names_its_models(onnx_model):
    result = smtriton("config", onnx_model.parent, "--stdout")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {onnx_model.parent} is a model repository (models: scorer), not a model directory: give one of "
        f"its models, e.g. {onnx_model}"
    ]


def test_a_clean_validation_says_how_many_models_it_checked(onnx_model):
    assert smtriton("config", onnx_model).exit_code == 0
    (onnx_model.parent / "other").symlink_to(onnx_model, target_is_directory=True)
    result = smtriton("validate", onnx_model.parent)
    assert result.exit_code == 1  # the copy's config names another model: one error, not a clean run
    (onnx_model.parent / "other").unlink()
    result = smtriton("validate", onnx_model.parent)
    assert result.exit_code == 0, result.output
    assert "1 model checked, no errors" in result.stderr


# --- issue 15.7: `invoke --input NAME=JSON:DTYPE`, a dtype per input ----------------------------------


def test_each_json_input_may_name_its_dtype():
    name, ids = parse_input("ids=[[1,2]]:INT64", "float32")
    assert (name, ids.dtype, ids.tolist()) == ("ids", np.int64, [[1, 2]])
    assert parse_input("mask=[[1,1]]:int32", "float32")[1].dtype == np.int32
    assert parse_input("x=[0.5]", "float16")[1].dtype == np.float16  # --dtype stays the default
    with pytest.raises(typer.BadParameter, match="not a dtype"):
        parse_input("x=[1]:INT65", "float32")
    with pytest.raises(typer.BadParameter, match=r"NAME=@FILE, NAME=FILE\.npy or NAME=JSON"):
        parse_input("[1,2]", "float32")


# --- issue 26: a newcomer's mistakes with the AWS-facing commands, one line each --------------------


@pytest.mark.parametrize(
    "args",
    [("invoke", "demo", "--input", "x=[1]"), ("delete-endpoint", "demo")],
    ids=["invoke", "delete-endpoint"],
)
@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({}, "error: no AWS region: pass --region or set AWS_REGION"),
        ({"AWS_REGION": "us-east-1"}, "error: no AWS credentials found"),
        ({"AWS_PROFILE": "nobody"}, "error: The config profile (nobody) could not be found"),
    ],
    ids=["no region", "no credentials", "unknown profile"],
)
def test_aws_commands_without_region_or_credentials_say_so_in_one_line(args, env, line):
    result = CliRunner().invoke(cli.app, list(args), env=NO_AWS | env)
    assert result.exit_code in (1, 2), result.output
    assert result.stdout == ""
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith(line), error


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1"])
def test_a_local_endpoint_url_needs_no_aws_region_or_credentials(url):
    """A loopback --endpoint-url is smtriton local-endpoint (it checks neither): with no AWS configuration
    at all, the request goes out with placeholders and fails only because nothing listens there."""
    result = CliRunner().invoke(cli.app, ["invoke", "local", "--endpoint-url", url, "--input", "x=[1]"],
                                env=NO_AWS | {"AWS_MAX_ATTEMPTS": "1"})  # fmt: skip
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "region" not in line, line
    assert "credentials" not in line, line
    assert "Could not connect to the endpoint URL" in line, line


def test_an_endpoint_url_elsewhere_still_needs_a_region():
    result = CliRunner().invoke(
        cli.app, ["invoke", "demo", "--endpoint-url", "https://runtime.example.com", "--input", "x=[1]"], env=NO_AWS
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == ["error: no AWS region: pass --region or set AWS_REGION"]


def test_invoke_at_an_endpoint_url_where_nothing_listens_is_one_line():
    env = NO_AWS | {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                    "AWS_MAX_ATTEMPTS": "1"}  # fmt: skip
    result = CliRunner().invoke(cli.app, ["invoke", "demo", "--endpoint-url", "http://127.0.0.1:1", "--input", "x=[1]"],
                                env=env)  # fmt: skip
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert "http://127.0.0.1:1" in line, line


# --- issue 26: help reads as written: paragraphs flow to the terminal's width, brackets are shown ----


def _help_lines(*path: str) -> list[str]:
    """The help of a command at a width nothing needs wrapping at, one normalized string per line."""
    result = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "1000", "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    return [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]


def _command(path: tuple[str, ...]):
    group = get_command(cli.app)
    ctx = group.make_context("smtriton", ["--help"], resilient_parsing=True)
    command = group
    for name in path:
        command = command.get_command(ctx, name)
    return command


LEAVES = [path for path in COMMANDS if path and not getattr(_command(path), "commands", None)]


@pytest.mark.parametrize("path", LEAVES, ids=lambda path: " ".join(path))
def test_help_paragraphs_and_option_help_are_shown_whole(path):
    """A docstring's paragraph is one flowing line where the terminal is wide enough (not the source's
    line breaks), and an option's help keeps its bracketed text ("[default: ...]" is no markup tag)."""
    lines = _help_lines(*path)
    command = _command(path)
    docstring = inspect.cleandoc(command.callback.__doc__ or "")
    for paragraph in docstring.split("\n\n"):
        # A paragraph marked \b (click's mark) keeps its lines; any other flows as one line.
        kept = paragraph.startswith("\b")
        for part in paragraph.lstrip("\b\n").splitlines() if kept else [paragraph]:
            text = " ".join(part.split())
            assert any(text in line for line in lines), (text, lines)
    for param in command.params:
        if getattr(param, "help", None) and not getattr(param, "hidden", False):
            text = " ".join(param.help.replace("\\[", "[").split())
            assert any(text in line for line in lines), (param.name, text)


# --- issue 26: no traceback for a path a user mistyped -----------------------------------------------

REPO = ROOT / "tests" / "integration" / "models"
MISTAKES = {
    "config: no such folder": ["config", "{tmp}/missing"],
    "config: a file": ["config", "{tmp}/file.txt"],
    "package sme -o: a folder": ["package", "sme", str(REPO), "-o", "{tmp}", "--no-validate"],
    "package mme -o: a file": ["package", "mme", str(REPO), "-o", "{tmp}/file.txt", "--no-validate"],
    "invoke --request: no such file": ["invoke", "demo", "--request", "{tmp}/missing.json"],
    "invoke --input: no such .npy": ["invoke", "demo", "--input", "x={tmp}/missing.npy"],
    "local-endpoint --models: no such folder": ["local-endpoint", "--models", "{tmp}/missing"],
    "convert tensorrt: no such file": ["convert", "tensorrt", "{tmp}/missing.onnx"],
    "invoke --endpoint-url: no URL": ["invoke", "demo", "--endpoint-url", "{tmp}/not-a-url", "--input", "x=[1]"],
    "perf --endpoint-url: no URL": [
        "perf",
        "demo",
        "--endpoint-url",
        "{tmp}/not-a-url",
        "--model-dir",
        str(REPO / "addsub"),
    ],
}


@pytest.mark.parametrize("args", list(MISTAKES.values()), ids=list(MISTAKES))
def test_a_mistyped_path_is_one_line_naming_it(tmp_path, args):
    (tmp_path / "file.txt").write_text("not what was asked for")
    argv = [a.format(tmp=tmp_path) for a in args]
    env = NO_AWS | {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    result = CliRunner().invoke(cli.app, argv, env=env)
    assert isinstance(result.exception, SystemExit), result.exception  # not an exception's traceback
    assert result.exit_code in (1, 2)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    named = next(a for a in argv if str(tmp_path) in a)
    assert named.split("=")[-1] in line, line


@pytest.mark.parametrize("path", LEAVES, ids=lambda path: " ".join(path))
def test_help_fits_a_narrow_terminal_and_cuts_no_word_of_it(path):
    """At 80 columns every line fits; the description's paragraphs read whole once their wrapped lines
    are joined again (the terminal's width decides the breaks, not the docstring's); and every word of
    an option's help is there, a word wider than its column folded onto the next line rather than cut
    with an ellipsis. (Long option names themselves are shortened by typer's table at this width.)"""
    result = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    flowing = " ".join(" ".join(line.replace("│", " ").split()) for line in lines)
    for paragraph in inspect.cleandoc(_command(path).callback.__doc__ or "").split("\n\n"):
        if not paragraph.startswith("\b"):
            text = " ".join(paragraph.split())
            assert text in flowing, (text, result.output)
    joined = "".join(flowing.split())
    for param in _command(path).params:
        if getattr(param, "help", None) and not getattr(param, "hidden", False):
            cut = [w for w in param.help.replace("\\[", "[").split() if w not in joined]
            assert not cut, (param.name, cut, result.output)


# --- issue 33.10: help tells a first run's order, and each step what comes next ---------------------------


def test_the_root_help_gives_a_first_runs_order_and_names_serve():
    text = " ".join(_help_lines())
    assert "A first run, one model: convert -> config -> validate -> package -> local-endpoint" in text
    assert "or deploy (after build-image and push-image; then invoke)" in text
    assert "The server is a separate command, serve (serve --help)" in text


def test_validate_and_package_say_what_comes_next(onnx_model, tmp_path):
    assert "Next: smtriton package sme REPO" in " ".join(_help_lines("validate"))
    assert "Next: smtriton local-endpoint --model-data model.tar.gz (SME; with --default-model NAME when" in " ".join(
        _help_lines("package")
    )
    repo = onnx_model.parent
    assert smtriton("config", onnx_model).exit_code == 0
    validated = smtriton("validate", repo)
    assert validated.exit_code == 0, validated.output
    assert (
        validated.stderr.strip().splitlines()[-1]
        == f"next: smtriton package sme {repo} (or package mme, one archive per model)"
    )
    packaged = smtriton("package", "sme", repo, "-o", tmp_path / "model.tar.gz")
    assert packaged.exit_code == 0, packaged.output
    assert f"next: smtriton local-endpoint --model-data {tmp_path / 'model.tar.gz'} calls it here" in packaged.stderr


def test_config_input_help_says_how_the_batch_axis_is_written_and_does_so(onnx_model):
    help_text = " ".join(_help_lines("config"))
    assert "the batch axis first when Triton batches, written as a name or -1" in help_text
    result = smtriton("config", onnx_model, "--stdout", "--max-batch-size", "8",
                      "--input", "x:FP32:batch,4", "--output-tensor", "y:FP32:-1,2")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "max_batch_size: 8" in result.stdout
    assert [line.strip() for line in result.stdout.splitlines() if "dims" in line] == ["dims: 4", "dims: 2"]


@pytest.mark.parametrize(
    "path",
    [("deploy",), ("invoke",), ("transform",), ("capture", "decode"), ("delete-endpoint",)],
    ids=lambda path: " ".join(path),
)
def test_the_aws_commands_show_an_example(path):
    result = smtriton(*path, "--help")
    assert result.exit_code == 0
    text = result.output
    examples = text[text.index("Examples:") :]
    assert f"smtriton {' '.join(path)} " in examples
