"""What the conversion commands (``smtriton convert onnx|torchscript|tensorrt``, ``smtriton config``)
share: one-line errors, the check of what they wrote, the ``NAME:DTYPE:DIMS`` and ``KEY=VALUE`` option
forms, and the options they have in common."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from smtriton.convert.recipe import RecipeError
from smtriton.errors import ToolError, ToolUsageError

console = Console(stderr=True, soft_wrap=True)  # one message, one line (logs, grep)
# A default inside the source checkout is not one a user can type: help names it instead.
DEMO_RECIPE_SHOWN = "the demo recipe, model_repository/recipe.toml of a source checkout"


def fail(message: str, code: int = 2) -> ToolError:
    """The error to raise: the `smtriton` command prints it as one line and exits ``code`` (2: usage, 1)."""
    return ToolUsageError(message) if code == 2 else ToolError(message)


def validate_written(repo: Path, names: Sequence[str]) -> None:
    """Run the repository validator on the models just written, so ✓ is never printed for a config
    Triton would refuse."""
    from smtriton.repo.validate import errors, validate_repository

    problems = validate_repository(repo, models=names)
    for problem in problems:
        console.print(problem.line(repo), highlight=False, markup=False)
    found = errors(problems)
    if found:
        raise ToolError(f"written, but Triton would refuse {found[0].path}: {found[0].message}")


_TENSOR = re.compile(
    r"^(?P<name>[^:]+)(?::(?P<dtype>[A-Z0-9]+):(?P<dims>[^:]+)(?::(?P<low>-?\d+)\.\.(?P<high>-?\d+))?)?$"
)


def parse_tensor(text: str, *, require_type: bool) -> dict[str, Any]:
    """``NAME:DTYPE:d1,d2[:LOW..HIGH]`` (dims: sizes or axis names) -> a recipe tensor table."""
    m = _TENSOR.match(text.strip())
    if not m or (require_type and not m.group("dtype")):
        form = "NAME:DTYPE:DIMS[:LOW..HIGH]" if require_type else "NAME[:DTYPE:DIMS]"
        raise RecipeError(f"tensor {text!r}: write {form}, e.g. input_ids:INT64:batch,sequence:0..30522")
    table: dict[str, Any] = {"name": m.group("name")}
    if m.group("dtype"):
        table["dtype"] = m.group("dtype")
        table["shape"] = [int(d) if d.lstrip("-").isdigit() else d for d in m.group("dims").split(",")]
    if m.group("low") is not None:
        table["range"] = [int(m.group("low")), int(m.group("high"))]
    return table


def parse_pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` -> dict (``--parameter``, ``--axis`` and the like)."""
    pairs: dict[str, str] = {}
    for value in values or ():
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"{what} {value!r}: write KEY=VALUE")
        pairs[key.strip()] = val.strip()
    return pairs


ModelOpt = Annotated[str | None, typer.Option("--model", "-m", metavar="NAME", help="Recipe entry to convert.")]
MbsOpt = Annotated[
    int | None,
    typer.Option("--max-batch-size", min=0, help="> 0: Triton batches; shapes start with the axis 'batch'."),
]
# Required: a default folder would be whichever one of that name the current directory happens to hold.
OutputOpt = Annotated[
    Path, typer.Option("--output", "-o", help="Model repository to write <name>/<version>/ into (required).")
]
VersionOpt = Annotated[int, typer.Option(min=1, help="Version directory.")]
ConfigFlag = Annotated[
    bool, typer.Option("--config/--no-config", help="Write config.pbtxt too (else run `smtriton config`).")
]
AtolOpt = Annotated[float | None, typer.Option(help="Parity: absolute tolerance.")]
RtolOpt = Annotated[float | None, typer.Option(help="Parity: relative tolerance.")]
