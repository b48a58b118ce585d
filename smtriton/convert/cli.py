"""``smtriton convert onnx|torchscript|tensorrt``: a PyTorch model into a Triton repository.

The options of ``onnx`` and ``torchscript`` become a recipe table (:func:`model_spec`), so the recipe's
rules and messages apply to a model named on the command line; the export, the parity check and the
config are :mod:`smtriton.convert.build`'s. ``tensorrt`` is :mod:`smtriton.convert.tensorrt_cli`'s, and
``smtriton config`` :mod:`smtriton.convert.config_cli`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from smtriton.convert.cli_shared import (
    DEMO_RECIPE_SHOWN,
    AtolOpt,
    ConfigFlag,
    MbsOpt,
    ModelOpt,
    OutputOpt,
    RtolOpt,
    VersionOpt,
    console,
    fail,
    parse_pairs,
    parse_tensor,
    validate_written,
)
from smtriton.convert.recipe import COMMAND_LINE, DEFAULT_RECIPE, TORCH_FORMATS, ModelSpec, RecipeError
from smtriton.convert.tensorrt_cli import convert_tensorrt
from smtriton.errors import ToolError

convert_app = typer.Typer(
    help="Convert a PyTorch model (recipe entry or package.module:factory) to ONNX, TorchScript or TensorRT. "
    "A recipe's Python models and ensembles are not converted: `smtriton build-repository RECIPE -m NAME` "
    "builds them (and every other format).",
    short_help="Convert a PyTorch model (recipe entry or package.module:factory) to ONNX, TorchScript or TensorRT.",
    no_args_is_help=True,
)


def model_spec(
    fmt: str,
    *,
    recipe: Path,
    model: str | None,
    factory: str | None,
    inputs: Sequence[str] | None,
    outputs: Sequence[str] | None,
    max_batch_size: int | None,
    axes: Sequence[str] | None,
    seed: int | None,
    checkpoint: Path | None,
    name: str | None,
    export: dict[str, Any],
    parity: dict[str, Any],
) -> ModelSpec:
    """The model to convert: a recipe entry (``--model``) or a factory with its input spec, then overrides."""
    from smtriton.convert.recipe_parse import load_recipe, model_from_table

    if factory is not None:
        # The recipe's rule (a [[model.input]] and a [[model.output]] at least), in the words of the flags.
        if not inputs or not outputs:
            wanted = [flag for flag, given in (("--input", inputs), ("--output-tensor", outputs)) if not given]
            raise RecipeError(f"--factory needs at least one {' and at least one '.join(wanted)}, one per tensor")
        table: dict[str, Any] = {
            "name": name or factory.rsplit(":", 1)[-1],
            "factory": factory,
            "input": [parse_tensor(t, require_type=True) for t in inputs or ()],
            "output": [parse_tensor(t, require_type=False) for t in outputs or ()],
            "max_batch_size": max_batch_size or 0,
        }
        base_dir, where = Path.cwd(), COMMAND_LINE
    else:
        loaded = load_recipe(recipe)
        if model is None and len(loaded.models) != 1:
            raise RecipeError(f"{loaded.path}: name the model with --model ({', '.join(loaded.names)})")
        entry = loaded.model(model) if model else loaded.models[0]
        if entry.format not in TORCH_FORMATS:
            raise RecipeError(_not_converted(loaded.path, entry.name, entry.format))
        table = dict(entry.raw)
        if inputs or outputs:
            raise RecipeError("--input/--output-tensor describe a --factory model; edit the recipe instead")
        if max_batch_size is not None:
            table["max_batch_size"] = max_batch_size
        base_dir, where = loaded.path.parent, f"{loaded.path}: model {entry.name!r}"
    if table.get("format") != fmt:
        table.pop("export", None)  # the other format's export options do not apply
    table["format"] = fmt
    if name:
        table["name"] = name
    if axes:
        table["axes"] = {k: [int(s) for s in v.split(",")] for k, v in parse_pairs(axes, "--axis").items()}
    if seed is not None:
        table["seed"] = seed
    if checkpoint is not None:
        table["checkpoint"] = str(checkpoint.resolve())
    if export:
        table["export"] = {**table.get("export", {}), **export}
    if parity:
        table["parity"] = {**table.get("parity", {}), **parity}
    return model_from_table(table, base_dir, where)


def _not_converted(recipe: Path, name: str, fmt: str) -> str:
    """Why a recipe entry of another format than ONNX or TorchScript is not `convert`'s, and what builds it."""
    build = f"`smtriton build-repository {recipe} -m {name}`"
    if fmt == "tensorrt":
        return f"{recipe}: model {name!r} is a TensorRT plan: build it with {build} (or `smtriton convert tensorrt`)"
    return f"{recipe}: model {name!r} is format {fmt!r}, which convert does not export: build it with {build}"


RecipeArg = Annotated[
    Path,
    typer.Argument(
        metavar="RECIPE",
        help="Recipe naming the model (format: top of model_repository/recipe.toml).",
        show_default=DEMO_RECIPE_SHOWN,
    ),
]
FactoryOpt = Annotated[
    str | None,
    typer.Option(help="Instead of a recipe: 'package.module:function' returning the torch.nn.Module."),
]
InputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        metavar="NAME:DTYPE:DIMS[:LOW..HIGH]",
        help="With --factory, per input in forward() order, e.g. ids:INT64:batch,sequence:0..30522.",
    ),
]
OutputTensorOpt = Annotated[
    list[str] | None,
    typer.Option("--output-tensor", metavar="NAME[:DTYPE:DIMS]", help="With --factory, one per output."),
]
AxisOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--axis", metavar="AXIS=SIZES", help="Parity-check sizes of an axis, e.g. sequence=7,32 (repeatable)."
    ),
]
SeedOpt = Annotated[int | None, typer.Option(help="torch.manual_seed before the factory runs.")]
CheckpointOpt = Annotated[Path | None, typer.Option(help="State-dict file loaded into the module.")]
NameOpt = Annotated[str | None, typer.Option(help="Model name in the repository (default: the recipe's).")]
TrialsOpt = Annotated[int | None, typer.Option(help="Parity: random inputs per combination of axis sizes.")]


def _parity(atol: float | None, rtol: float | None, trials: int | None) -> dict[str, Any]:
    values = {"atol": atol, "rtol": rtol, "trials": trials}
    return {k: v for k, v in values.items() if v is not None}


def _run_conversion(spec: ModelSpec, output: Path, version: int, with_config: bool) -> None:
    from smtriton.convert.build import build_model
    from smtriton.convert.parity import ParityError

    output.mkdir(parents=True, exist_ok=True)
    # A spinner only on a terminal: elsewhere (a pipe, a log) it would leave a blank line before the result.
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True, disable=not console.is_terminal) as bar:  # fmt: skip
        task = bar.add_task(f"[bold]{spec.name}[/]", total=None)
        try:
            result = build_model(
                spec,
                output.resolve(),
                force=True,
                progress=lambda name, message: bar.update(task, description=f"[bold]{name}[/]: {message}"),
                version=version,
                with_config=with_config,
            )
        except ParityError as exc:
            raise fail(str(exc), 1) from None
        except ToolError:
            raise
        except Exception as exc:  # exporters raise many kinds; the message is what the user needs
            raise fail(f"model {spec.name!r}: {exc}", 1) from None
    artifact = next(p for p in (result.path / str(version)).iterdir() if p.name.startswith("model."))
    if with_config:
        validate_written(output, [spec.name])
    p = result.parity
    console.print(f"[green]✓[/] {artifact} ({result.seconds:.1f} s)", highlight=False)
    if p is not None:
        console.print(f"  {p.summary().splitlines()[0]}", highlight=False, soft_wrap=True)
    if with_config:
        console.print(f"  config: {result.path / 'config.pbtxt'}", highlight=False)


@convert_app.command("onnx")
def convert_onnx(
    output: OutputOpt,
    recipe: RecipeArg = DEFAULT_RECIPE,
    model: ModelOpt = None,
    factory: FactoryOpt = None,
    input_: InputOpt = None,
    output_tensor: OutputTensorOpt = None,
    max_batch_size: MbsOpt = None,
    axis: AxisOpt = None,
    seed: SeedOpt = None,
    checkpoint: CheckpointOpt = None,
    name: NameOpt = None,
    version: VersionOpt = 1,
    config: ConfigFlag = True,
    opset: Annotated[int | None, typer.Option(help="ONNX opset (recipe default 17).")] = None,
    dynamo: Annotated[
        bool | None,
        typer.Option("--dynamo/--no-dynamo", help="torch.export-based exporter, or TorchScript-based (default)."),
    ] = None,
    simplify: Annotated[bool, typer.Option(help="Simplify the graph with onnxslim (or onnxsim).")] = False,
    fp16: Annotated[
        bool, typer.Option(help="Cast to FP16 inside, FP32 inputs/outputs (for TensorRT 11 strongly typed builds).")
    ] = False,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    trials: TrialsOpt = None,
) -> None:
    """Export to model.onnx with named inputs/outputs and dynamic axes, then check it against torch.

    ONNX Runtime must match the eager model on fresh random inputs at every combination of axis sizes
    (max abs/rel error reported; fails above tolerance). Writes <output>/<name>/<version>/model.onnx
    and, unless --no-config, config.pbtxt.
    """
    export: dict[str, Any] = {"opset": opset, "dynamo": dynamo}
    export = {k: v for k, v in export.items() if v is not None}
    if simplify:
        export["simplify"] = True
    if fp16:
        export["fp16"] = True
    try:
        spec = model_spec(
            "onnx", recipe=recipe, model=model, factory=factory, inputs=input_, outputs=output_tensor,
            max_batch_size=max_batch_size, axes=axis, seed=seed, checkpoint=checkpoint, name=name,
            export=export, parity=_parity(atol, rtol, trials),
        )  # fmt: skip
    except KeyError as exc:
        raise fail(str(exc.args[0])) from None
    _run_conversion(spec, output, version, config)


@convert_app.command("torchscript")
def convert_torchscript(
    output: OutputOpt,
    recipe: RecipeArg = DEFAULT_RECIPE,
    model: ModelOpt = None,
    factory: FactoryOpt = None,
    input_: InputOpt = None,
    output_tensor: OutputTensorOpt = None,
    max_batch_size: MbsOpt = None,
    axis: AxisOpt = None,
    seed: SeedOpt = None,
    checkpoint: CheckpointOpt = None,
    name: NameOpt = None,
    version: VersionOpt = 1,
    config: ConfigFlag = True,
    method: Annotated[str | None, typer.Option(help="'trace' (default) or 'script'.")] = None,
    freeze: Annotated[bool | None, typer.Option("--freeze/--no-freeze", help="torch.jit.freeze (default on).")] = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    trials: TrialsOpt = None,
) -> None:
    """Trace (or script) to model.pt for Triton's PyTorch backend, then check it against torch.

    Inputs and outputs must be named INPUT__0, OUTPUT__0, ... (the backend's convention). The
    signature is stored inside model.pt, so `smtriton config` and `smtriton validate` can read it.
    """
    export: dict[str, Any] = {"method": method, "freeze": freeze}
    try:
        spec = model_spec(
            "torchscript", recipe=recipe, model=model, factory=factory, inputs=input_, outputs=output_tensor,
            max_batch_size=max_batch_size, axes=axis, seed=seed, checkpoint=checkpoint, name=name,
            export={k: v for k, v in export.items() if v is not None}, parity=_parity(atol, rtol, trials),
        )  # fmt: skip
    except KeyError as exc:
        raise fail(str(exc.args[0])) from None
    _run_conversion(spec, output, version, config)


convert_app.command("tensorrt")(convert_tensorrt)
