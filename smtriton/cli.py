"""``smtriton``: build-time tools, in workflow order: convert, config, validate, package, deploy, invoke."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer import rich_utils
from typer._click.core import Command, Context, HelpFormatter  # typer carries its own copy of click
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer.core import TyperCommand, TyperGroup, TyperOption

from smtriton.aws import cli as aws_cli
from smtriton.aws import endpoint_cli, invoke_cli
from smtriton.convert.cli import convert_app
from smtriton.convert.cli_shared import validate_written
from smtriton.convert.config_cli import config_command
from smtriton.convert.recipe import DEFAULT_RECIPE, RecipeError
from smtriton.errors import ToolError
from smtriton.repo.cli import package_app, report_merging, validate_command

console = Console(stderr=True)
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

# Commands whose modules are heavy to import (a web framework): loaded when run, listed from their docstring.
LAZY_COMMANDS = {
    "local-endpoint": "smtriton.local.cli:local_endpoint",
    "local-transform": "smtriton.local.transform_cli:local_transform",
    "perf": "smtriton.perf.cli:perf",
    "tune": "smtriton.tune.cli:tune",
}
# `smtriton --help` lists the commands in the order a model goes through them.
WORKFLOW = (
    "convert", "build-repository", "config", "validate", "package", "build-image", "push-image", "deploy", "invoke",
    "transform", "capture", "delete-endpoint", "local-endpoint", "local-transform", "perf", "tune",
)  # fmt: skip


def distribution_version() -> str:
    """The installed distribution's version (what `--version` prints)."""
    try:
        return version("smtriton")
    except PackageNotFoundError:
        return "unknown (not installed)"


def error_line(message: str) -> None:
    """A command's failure as the one line every tool prints: ``error: ...`` on stderr."""
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)


def _usage_message(exc: ClickException) -> str:
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, UsageError) and ctx is not None:
        message += f" (see {ctx.command_path} --help)"
    return " ".join(message.replace("Value error, ", "").split())


def _flowing(text: str) -> str:
    """Help text as rich panels should get it: each paragraph one line (the terminal wraps it, not the
    docstring's line breaks), ``\\b`` paragraphs kept line by line (click's mark), markup brackets
    escaped so that ``[default: ...]`` is shown, not taken for a style."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if paragraph.startswith("\b"):
            paragraphs.append(escape(paragraph.lstrip("\b\n")))
        else:
            paragraphs.append(escape(" ".join(paragraph.split())))
    return "\n\n".join(paragraphs)


def _folding_option_help() -> None:
    """Rich cuts a word wider than the option table's help column with an ellipsis (an
    ``s3://.../model.tar.gz`` example became ``s3://.../model.ta…`` at 80 columns): option help folds
    such a word onto the next line instead, so that nothing of it is lost on a narrow terminal."""
    build = getattr(rich_utils, "_get_parameter_help", None)
    if build is None or getattr(build, "_folding", False):
        return  # another typer: its own rendering stands

    def folding(**kwargs: Any) -> Any:
        columns = build(**kwargs)
        for item in getattr(columns, "renderables", ()):
            if isinstance(item, Text):
                item.overflow = "fold"
        return columns

    folding._folding = True  # type: ignore[attr-defined]
    rich_utils._get_parameter_help = folding


_folding_option_help()


def _plain_flags(command: Command) -> None:
    """An on/off flag takes no value, so its help shows none (typer would print ``<bool>``); help text
    flows to the terminal's width and shows its brackets (see :func:`_flowing`)."""
    if command.help and not getattr(command, "_flowing", False):
        command.help = _flowing(command.help)
        command._flowing = True  # type: ignore[attr-defined]  # once: escaping twice would show backslashes
    for param in command.params:
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""
        help_text = getattr(param, "help", None)
        if help_text and not getattr(param, "_flowing", False):
            param.help = _flowing(help_text)  # type: ignore[attr-defined]
            param._flowing = True  # type: ignore[attr-defined]
    make_help_option = command.get_help_option

    def help_option(ctx: Context) -> Any:
        option = make_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option  # type: ignore[method-assign]
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _plain_flags(sub)


def _docstring_summary(target: str) -> str:
    """First paragraph of a lazy command's docstring, read from its source without importing it."""
    module, _, name = target.partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return (ast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
    return ""


def _load_command(name: str, target: str) -> Command:
    module, _, attr = target.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module), attr)
    single = typer.Typer(add_completion=False)
    single.command(name)(function)
    command = typer.main.get_command(single)
    command.name = name
    _plain_flags(command)
    return command


class ToolGroup(TyperGroup):
    """The `smtriton` group: every error one line with its exit status, lazy heavy commands, plain flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_flags(self)
        self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        names = [*super().list_commands(ctx), *(n for n in LAZY_COMMANDS if n not in self.commands)]
        return sorted(names, key=lambda n: WORKFLOW.index(n) if n in WORKFLOW else len(WORKFLOW))

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None or cmd_name in self.commands:
            return super().get_command(ctx, cmd_name)
        if self._listing:  # the command list needs only the summary
            return TyperCommand(cmd_name, help=_docstring_summary(target))
        self.commands[cmd_name] = _load_command(cmd_name, target)
        return self.commands[cmd_name]

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        if extra.pop("standalone_mode", True) is False:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, standalone_mode=False, **extra)
        except NoArgsIsHelpError:  # the help is already printed; no command is a usage error all the same
            sys.exit(2)
        except ClickException as exc:
            error_line(_usage_message(exc))
            sys.exit(exc.exit_code)
        except ToolError as exc:
            error_line(str(exc))
            sys.exit(exc.exit_code)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


ROOT_HELP = """Build-time tools for serving PyTorch models with Triton behind the SageMaker contract.

A first run, one model: convert -> config -> validate -> package -> local-endpoint (call it on this
machine, as boto3 calls SageMaker) or deploy (after build-image and push-image; then invoke). convert
writes a config.pbtxt already; config rewrites it with other batching or instances. build-repository
builds every model of a recipe at once; perf and tune measure a served model; transform runs a batch
transform job and capture decode reads an endpoint's captured data.

The server is a separate command, serve (serve --help): what the image runs as SageMaker starts it, and
what local-endpoint starts here.
"""

app = typer.Typer(
    cls=ToolGroup,
    help=ROOT_HELP,
    no_args_is_help=True,
    add_completion=False,
    context_settings=HELP_OPTIONS,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"smtriton {distribution_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """The options of `smtriton` itself; its help is ROOT_HELP."""


def build_repository_command(
    recipe: Annotated[
        Path,
        typer.Argument(
            metavar="RECIPE",
            help="Recipe listing the models (format documented at the top of the demo recipe).",
            show_default="the demo recipe, model_repository/recipe.toml of a source checkout",
        ),
    ] = DEFAULT_RECIPE,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Repository directory; default: the recipe's directory."),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model", "-m", metavar="NAME", help="Build only this model and those it is built from (repeatable)."
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even models whose stamp is current.")] = False,
) -> None:
    """Build a Triton model repository from a recipe (the demo repository by default).

    Exports every model (ONNX, TorchScript, Python backend), checks each artifact against its torch
    model on fresh random inputs, and writes Triton's config.pbtxt. Ensembles are checked against their
    steps' configs and run end to end against the eager models; TensorRT plans are built where TensorRT
    can be imported (else skipped, with the command that builds them in the serving image). Models whose
    stamp (recipe entry, source files, the models they are built from, tool versions) is unchanged are
    skipped, so a second run is instant.
    """
    from smtriton.convert.build import build_repository

    tasks: dict[str, TaskID] = {}
    with Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # elsewhere it would leave a blank line before the table
    ) as bar:

        def on_progress(name: str, message: str) -> None:
            if name not in tasks:
                for earlier in tasks.values():
                    bar.update(earlier, completed=1)
                tasks[name] = bar.add_task("", total=1)
            bar.update(tasks[name], description=f"[bold]{name}[/]: {message}")

        try:
            report = build_repository(recipe, output, models=model or None, force=force, progress=on_progress)
        except KeyError as exc:
            raise RecipeError(str(exc.args[0])) from None

    table = Table(title=f"Model repository {escape(str(report.output))}", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("model", no_wrap=True)
    table.add_column("format", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for column in ("cases", "max abs", "max rel"):
        table.add_column(column, justify="right", no_wrap=True)
    style = {"built": "green", "up to date": "dim", "skipped": "yellow", "failed": "bold red"}
    for r in report.results:
        p = r.parity
        table.add_row(
            r.name,
            r.format,
            f"[{style[r.status]}]{r.status}[/]" + (f" {r.seconds:.1f} s" if r.status == "built" else ""),
            str(p.cases) if p else "-",
            f"{p.max_abs:.1e}" if p else "-",
            f"{p.max_rel:.1e}" if p else "-",
        )
    console.print(table)
    for name in report.removed:
        console.print(f"removed [bold]{name}[/]: built from this recipe earlier, no longer listed")
    for r in report.results:
        if r.note:
            console.print(f"[yellow]{r.name} skipped:[/] {escape(r.note)}", soft_wrap=True, highlight=False)
        if r.error:
            console.print(f"[bold red]{r.name} failed:[/] {escape(r.error)}", soft_wrap=True, highlight=False)
    if not report.ok:
        raise typer.Exit(1)
    present = [r for r in report.results if r.status != "skipped"]
    validate_written(report.output, [r.name for r in present])
    report_merging(report.output, [r.name for r in present])
    skipped = f", {len(report.results) - len(present)} skipped" if len(present) < len(report.results) else ""
    if report.up_to_date:
        console.print(f"All {len(present)} models up to date{skipped} ({report.seconds:.2f} s), nothing to build.")
    else:
        built = sum(r.status == "built" for r in report.results)
        console.print(f"Built {built} of {len(report.results)} models{skipped} in {report.seconds:.1f} s.")


app.add_typer(convert_app, name="convert")
app.command("build-repository")(build_repository_command)
app.command("config")(config_command)
app.command("validate")(validate_command)
app.add_typer(package_app, name="package")
app.command("build-image")(aws_cli.build_image_command)
app.command("push-image")(aws_cli.push_image_command)
app.command("deploy")(endpoint_cli.deploy_command)
app.command("invoke")(invoke_cli.invoke_command)
app.command("transform")(endpoint_cli.transform_command)
app.add_typer(invoke_cli.capture_app, name="capture")
app.command("delete-endpoint")(endpoint_cli.delete_endpoint_command)


def main() -> None:
    """The `smtriton` command: any error is one line on stderr and exit status 2 (usage) or 1 (failure)."""
    app()
