"""``smtriton``: build-time tools (model repositories today; conversion, packaging and deploy grow here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from smtriton.aws import cli as aws_cli
from smtriton.convert.cli import config_command, convert_app
from smtriton.convert.recipe import DEFAULT_RECIPE, RecipeError
from smtriton.errors import ToolError
from smtriton.local.cli import local_endpoint
from smtriton.repo.cli import package_app, validate_command

app = typer.Typer(
    help="Build-time tools for serving PyTorch models with Triton behind the SageMaker contract.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Build-time tools for serving PyTorch models with Triton behind the SageMaker contract."""


@app.command("build-repository")
def build_repository_command(
    recipe: Annotated[
        Path,
        typer.Argument(help="Recipe listing the models (format documented at the top of the demo recipe)."),
    ] = DEFAULT_RECIPE,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Repository directory; default: the recipe's directory."),
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="Build only this model (repeatable).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even models whose stamp is current.")] = False,
) -> None:
    """Build a Triton model repository from a recipe (the demo repository by default).

    Exports every model (ONNX, TorchScript, Python backend), checks each artifact against its torch
    model on fresh random inputs, and writes Triton's config.pbtxt. Models whose stamp (recipe entry,
    source files, tool versions) is unchanged are skipped, so a second run is instant.
    """
    from smtriton.convert.build import build_repository

    tasks: dict[str, TaskID] = {}
    with Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:

        def on_progress(name: str, message: str) -> None:
            if name not in tasks:
                for earlier in tasks.values():
                    bar.update(earlier, completed=1)
                tasks[name] = bar.add_task("", total=1)
            bar.update(tasks[name], description=f"[bold]{name}[/]: {message}")

        try:
            report = build_repository(recipe, output, models=model or None, force=force, progress=on_progress)
        except (RecipeError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
            console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
            raise typer.Exit(2) from None

    table = Table(title=f"Model repository {escape(str(report.output))}", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("model", no_wrap=True)
    table.add_column("format", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for column in ("cases", "max abs", "max rel"):
        table.add_column(column, justify="right", no_wrap=True)
    style = {"built": "green", "up to date": "dim", "failed": "bold red"}
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
        if r.error:
            console.print(f"[bold red]{r.name} failed:[/] {escape(r.error)}", soft_wrap=True, highlight=False)
    if not report.ok:
        raise typer.Exit(1)
    if report.up_to_date:
        console.print(f"All {len(report.results)} models up to date ({report.seconds:.2f} s), nothing to build.")
    else:
        built = sum(r.status == "built" for r in report.results)
        console.print(f"Built {built} of {len(report.results)} models in {report.seconds:.1f} s.")


app.command("local-endpoint")(local_endpoint)
app.add_typer(convert_app, name="convert")
app.command("config")(config_command)
app.command("validate")(validate_command)
app.add_typer(package_app, name="package")
app.command("build-image")(aws_cli.build_image_command)
app.command("push-image")(aws_cli.push_image_command)
app.command("deploy")(aws_cli.deploy_command)
app.command("delete-endpoint")(aws_cli.delete_endpoint_command)
app.command("invoke")(aws_cli.invoke_command)


def main() -> None:
    """The `smtriton` command: a tool's error is one line on stderr and exit status 2 (usage) or 1."""
    try:
        app()
    except ToolError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise SystemExit(exc.exit_code) from None
