"""``smtriton convert onnx|torchscript|tensorrt`` and ``smtriton config``: models into a Triton repository.

Thin: options become a recipe table (so the recipe's rules and messages apply to models named on the
command line) or a :class:`smtriton.convert.config.ConfigOptions`; the work is in :mod:`smtriton.convert.build`,
:mod:`smtriton.convert.config` and :mod:`smtriton.convert.trt_build`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from smtriton.convert.recipe import COMMAND_LINE, DEFAULT_RECIPE, ModelSpec, RecipeError
from smtriton.errors import ToolError, ToolUsageError

console = Console(stderr=True, soft_wrap=True)  # one message, one line (logs, grep)
convert_app = typer.Typer(
    help="Convert a PyTorch model (recipe entry or package.module:factory) to ONNX, TorchScript or TensorRT.",
    no_args_is_help=True,
)
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


# --- model source: a recipe entry or command-line options -------------------------------------------

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
    from smtriton.convert.recipe import load_recipe, model_from_table

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


RecipeArg = Annotated[
    Path,
    typer.Argument(
        metavar="RECIPE",
        help="Recipe naming the model (format: top of model_repository/recipe.toml).",
        show_default=DEMO_RECIPE_SHOWN,
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", metavar="NAME", help="Recipe entry to convert.")]
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
MbsOpt = Annotated[
    int | None,
    typer.Option("--max-batch-size", min=0, help="> 0: Triton batches; shapes start with the axis 'batch'."),
]
AxisOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--axis", metavar="AXIS=SIZES", help="Parity-check sizes of an axis, e.g. sequence=7,32 (repeatable)."
    ),
]
SeedOpt = Annotated[int | None, typer.Option(help="torch.manual_seed before the factory runs.")]
CheckpointOpt = Annotated[Path | None, typer.Option(help="State-dict file loaded into the module.")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Model repository to write <name>/<version>/ into.")]
NameOpt = Annotated[str | None, typer.Option(help="Model name in the repository (default: the recipe's).")]
VersionOpt = Annotated[int, typer.Option(min=1, help="Version directory.")]
ConfigFlag = Annotated[
    bool, typer.Option("--config/--no-config", help="Write config.pbtxt too (else run `smtriton config`).")
]
AtolOpt = Annotated[float | None, typer.Option(help="Parity: absolute tolerance.")]
RtolOpt = Annotated[float | None, typer.Option(help="Parity: relative tolerance.")]
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
    recipe: RecipeArg = DEFAULT_RECIPE,
    output: OutputOpt = Path("model_repository"),
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
    recipe: RecipeArg = DEFAULT_RECIPE,
    output: OutputOpt = Path("model_repository"),
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


# --- TensorRT ----------------------------------------------------------------------------------------


class _RichMonitor:
    """TensorRT's progress monitor as rich progress bars, one per build phase (called from TRT threads)."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}
        self.lock = threading.Lock()

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        with self.lock:
            indent = "  " if parent else ""
            self.tasks[phase] = self.bar.add_task(f"{indent}{phase}", total=max(steps, 1))

    def step_complete(self, phase: str, step: int) -> bool:
        with self.lock:
            if phase in self.tasks:
                self.bar.update(self.tasks[phase], completed=step + 1)
        return True

    def phase_finish(self, phase: str) -> None:
        with self.lock:
            task = self.tasks.pop(phase, None)
            if task is not None:
                self.bar.remove_task(task)


def _calibration_batches(path: Path) -> Callable[[], Iterator[dict[str, Any]]]:
    import numpy as np

    def batches() -> Iterator[dict[str, Any]]:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        count = min(len(a) for a in arrays.values())
        for i in range(count):
            yield {k: a[i] for k, a in arrays.items()}

    return batches


@convert_app.command("tensorrt")
def convert_tensorrt(
    source: Annotated[
        Path,
        typer.Argument(
            metavar="SOURCE", help="model.onnx, or a model directory holding one (highest version).", exists=True
        ),
    ],
    output: OutputOpt = Path("model_repository"),
    name: Annotated[str | None, typer.Option(help="Model name (default: the source model's, with _trt).")] = None,
    version: VersionOpt = 1,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            metavar="AXIS=MIN:OPT:MAX,...",
            help="Optimization profile, e.g. batch=1:8:16,sequence=1:128:512 "
            "(repeat for several). Every dynamic axis needs its sizes here, but the batch axis: without "
            "--profile it is batch=1:N:N with --max-batch-size N (or the --recipe/--model entry's).",
        ),
    ] = None,
    recipe: Annotated[Path | None, typer.Option(help="Recipe whose entry gives axes, ranges and batching.")] = None,
    model: ModelOpt = None,
    max_batch_size: MbsOpt = None,
    precision: Annotated[
        str,
        typer.Option(
            help="fp32 | fp16 | bf16 | int8 | strongly-typed. TensorRT 10: builder flags. TensorRT 11: "
            "strongly typed only; fp16 casts the ONNX to FP16 first, bf16/int8 need a Q/DQ or cast graph."
        ),
    ] = "fp32",
    workspace: Annotated[str | None, typer.Option(help="Workspace memory limit, e.g. 4GiB.")] = None,
    timing_cache: Annotated[Path | None, typer.Option(help="Timing cache: read if present, written after.")] = None,
    optimization_level: Annotated[int | None, typer.Option(min=0, max=5, help="Builder optimization level.")] = None,
    version_compatible: Annotated[bool, typer.Option(help="Loadable by later TensorRT of the same major.")] = False,
    hardware_compatibility: Annotated[str, typer.Option(help="none | ampere-plus | same-compute-capability.")] = "none",
    calibration_data: Annotated[
        Path | None, typer.Option(help="INT8 (TensorRT 10): .npz, one array per input, axis 0 = batches.")
    ] = None,
    calibration_cache: Annotated[Path | None, typer.Option(help="INT8 calibration cache file.")] = None,
    verify: Annotated[bool, typer.Option(help="Compare the plan with ONNX Runtime on the FP32 graph.")] = True,
    reference: Annotated[
        Path | None,
        typer.Option(
            help="FP32 ONNX to verify against (default: the source; give the FP32 graph when the "
            "source was exported with --fp16)."
        ),
    ] = None,
    range_: Annotated[
        list[str] | None,
        typer.Option("--range", metavar="NAME=LOW..HIGH", help="Integer input values for verification."),
    ] = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    config: ConfigFlag = True,
    device: Annotated[int, typer.Option(help="GPU index.")] = 0,
) -> None:
    """Build a TensorRT plan from ONNX (TensorRT 10.x or 11.x, on this host's GPU), verify it, write config.

    Run it where the plan will be served: inside the serving image on the same GPU type
    (smtriton/convert/build_tensorrt_in_image.sh), since a plan only loads with the TensorRT version and GPU
    that built it. Writes model.plan, the sidecar model.plan.json (TensorRT version, GPU, compute
    capability, profiles, precision) and config.pbtxt (instance group KIND_GPU).
    """
    from smtriton import model_config
    from smtriton.convert import trt_build
    from smtriton.convert.artifacts import SignatureError, find_artifact, onnx_signature
    from smtriton.convert.build import staged_dir
    from smtriton.convert.config import ConfigOptions
    from smtriton.convert.recipe import DynamicBatching, InstanceGroup, load_recipe
    from smtriton.convert.trt_plan import (
        TOLERANCES,
        ProfileError,
        parse_profile,
        parse_size,
        recipe_profile,
        sidecar_path,
    )

    try:
        onnx_path = source if source.is_file() else find_artifact(source)
        if onnx_path.suffix != ".onnx":
            raise fail(f"{onnx_path}: not an ONNX file")
        default_name = (source.name if source.is_dir() else onnx_path.parent.parent.name) + "_trt"
        model_name = name or default_name
        ranges: dict[str, tuple[int, int]] = {}
        mbs = max_batch_size
        spec = None
        if recipe is not None or model is not None:
            loaded = load_recipe(recipe or DEFAULT_RECIPE)
            spec = loaded.model(model) if model else loaded.models[0]
            ranges = {t.name: t.range for t in spec.inputs if t.range is not None}
            mbs = spec.max_batch_size if mbs is None else mbs
        for text in range_ or ():
            key, _, value = text.partition("=")
            low, _, high = value.partition("..")
            ranges[key] = (int(low), int(high))
        mbs = mbs or 0
        axes = sorted({d for t in onnx_signature(onnx_path).inputs for d in t.shape if isinstance(d, str)})
        unbounded = [a for a in axes if not (mbs > 0 and a == "batch")]
        if profile:
            profiles = [parse_profile(p) for p in profile]
        elif not unbounded:  # the batch axis alone: 1..max_batch_size
            preferred = spec.dynamic_batching.preferred_batch_size if spec and spec.dynamic_batching else ()
            profiles = [recipe_profile({}, mbs, preferred)]
        else:
            raise fail(
                f"give --profile with the sizes the plan accepts for the dynamic axes {', '.join(unbounded)} "
                "(a recipe's axes are its parity check's sizes, not bounds)"
            )
        options = trt_build.BuildOptions(
            profiles=profiles,
            precision=precision,
            workspace_bytes=parse_size(workspace) if workspace else None,
            timing_cache=timing_cache,
            calibration=_calibration_batches(calibration_data) if calibration_data else None,
            calibration_cache=calibration_cache,
            optimization_level=optimization_level,
            version_compatible=version_compatible,
            hardware_compatibility=hardware_compatibility,
            device=device,
        )
        model_dir = output / model_name
        model_dir.mkdir(parents=True, exist_ok=True)
        plan = model_dir / str(version) / "model.plan"
        default_atol, default_rtol = TOLERANCES[precision]
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())  # fmt: skip
        # Built and checked beside the version directory; it replaces that directory only once the plan
        # passed, so a failed build never leaves a plan where Triton would load it.
        with staged_dir(model_dir, str(version)) as staging:
            with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
                sidecar, report = trt_build.build_checked_plan(
                    onnx_path, staging / plan.name, options, max_batch_size=mbs, verify=verify, reference=reference,
                    ranges=ranges, atol=default_atol if atol is None else atol,
                    rtol=default_rtol if rtol is None else rtol, monitor=_RichMonitor(bar),
                )  # fmt: skip
            if report is not None and not report.passed:
                console.print(f"  {report.summary()}", highlight=False)
                raise typer.Exit(1)
        console.print(
            f"[green]✓[/] {plan} (TensorRT {sidecar.tensorrt_version}, {sidecar.gpu_name}, "
            f"compute capability {sidecar.compute_capability}, {sidecar.precision}); sidecar {sidecar_path(plan)}",
            highlight=False,
        )
        if report is not None:
            console.print(f"  {report.summary()}", highlight=False)
        if config:
            options_cfg = ConfigOptions(
                max_batch_size=mbs,
                dynamic_batching=DynamicBatching() if mbs > 0 else None,
                instance_groups=(InstanceGroup(1, "KIND_GPU"),),
            )
            path = model_config.write(trt_build.plan_config(model_name, plan, options_cfg), output / model_name)
            validate_written(output, [model_name])
            console.print(f"  config: {path}", highlight=False)
    except (trt_build.TensorRTError, ProfileError, SignatureError, RecipeError, ValueError) as exc:
        raise fail(str(exc), 1) from None


# --- config ------------------------------------------------------------------------------------------


@contextmanager
def _config_errors() -> Iterator[None]:
    try:
        yield
    except ToolError:
        raise
    except ValueError as exc:  # e.g. int() of a --warmup-size value
        raise fail(str(exc)) from None


class InstanceKind(str, Enum):
    """Where Triton places a model's instances (ModelInstanceGroup.Kind)."""

    KIND_AUTO = "KIND_AUTO"
    KIND_GPU = "KIND_GPU"
    KIND_CPU = "KIND_CPU"
    KIND_MODEL = "KIND_MODEL"


def config_command(
    model_dir: Annotated[
        Path,
        typer.Argument(
            metavar="MODEL_DIR",
            help="Model directory: <repo>/<name> with <version>/model.*.",
            exists=True,
            file_okay=False,
        ),
    ],
    name: Annotated[str | None, typer.Option(help="Model name (default: the directory's).")] = None,
    version: Annotated[str | None, typer.Option(help="Version whose artifact to read (default: highest).")] = None,
    max_batch_size: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="> 0: Triton batches along the artifact's first (dynamic) dimension. Default: "
            "what the artifact recorded, else 0.",
        ),
    ] = None,
    dynamic_batching: Annotated[
        bool | None, typer.Option("--dynamic-batching/--no-dynamic-batching", help="Default: on when batching.")
    ] = None,
    preferred_batch_size: Annotated[
        list[int] | None, typer.Option(min=1, metavar="SIZE", help="Dynamic batcher's preferred sizes (repeatable).")
    ] = None,
    max_queue_delay_us: Annotated[int, typer.Option(min=0, help="Dynamic batcher's queue delay, microseconds.")] = 0,
    instance_count: Annotated[int | None, typer.Option(min=1, help="Instances per device.")] = None,
    instance_kind: Annotated[
        InstanceKind | None,
        typer.Option(
            metavar="|".join(InstanceKind),
            show_default=InstanceKind.KIND_AUTO.value,
            help="Where the instances run.",
        ),
    ] = None,
    warmup: Annotated[bool, typer.Option(help="Warm-up request at load (random floats, zero integers).")] = False,
    warmup_size: Annotated[
        list[str] | None,
        typer.Option(metavar="AXIS=SIZE", help="Size of a dynamic axis in warm-up data, e.g. sequence=128."),
    ] = None,
    parameter: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="Backend parameter (repeatable), e.g. INFERENCE_MODE=true (PyTorch), intra_op_thread_count=4 "
            "(ONNX Runtime); a key the backend does not read is warned about, naming the ones it reads.",
        ),
    ] = None,
    graph_optimization_level: Annotated[
        int | None, typer.Option(help="ONNX Runtime graph optimization: -1 off, 1 extended (unset: all).")
    ] = None,
    accelerator: Annotated[
        str | None, typer.Option(help="ONNX Runtime execution accelerator: tensorrt (GPU) or openvino (CPU).")
    ] = None,
    accelerator_parameter: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="Accelerator parameter, e.g. precision_mode=FP16, max_workspace_size_bytes=1073741824.",
        ),
    ] = None,
    input_: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            metavar="NAME:DTYPE:DIMS",
            help="For artifacts without a signature (foreign model.pt). DIMS as the model sees them, the batch "
            "axis first when Triton batches, written as a name or -1: INPUT__0:FP32:batch,3,224,224 with "
            "--max-batch-size 8 becomes dims [3, 224, 224]; -1 marks any other variable dim.",
        ),
    ] = None,
    output_tensor: Annotated[
        list[str] | None,
        typer.Option("--output-tensor", metavar="NAME:DTYPE:DIMS", help="With --input: one per output."),
    ] = None,
    stdout: Annotated[bool, typer.Option("--stdout", help="Print the config instead of writing it.")] = False,
    force: Annotated[bool, typer.Option(help="Overwrite an existing config.pbtxt.")] = False,
) -> None:
    """Generate config.pbtxt from the artifact's own signature plus batching, instances and options.

    The signature is the ONNX graph's, the TensorRT sidecar's or the one stored in a converted
    TorchScript file; batching defaults to what the conversion recorded. Built through Triton's
    ModelConfig protobuf and written in its text format, never templated, then validated.
    """
    from smtriton import model_config
    from smtriton.convert.artifacts import PLATFORM_OF_FILE, Signature, TensorSig, artifact_signature, find_artifact
    from smtriton.convert.config import ConfigOptions, signature_config, unknown_parameters
    from smtriton.convert.recipe import DynamicBatching, InstanceGroup
    from smtriton.model_config import CONFIG_FILE
    from smtriton.repo.layout import require_model_directory

    with _config_errors():
        require_model_directory(model_dir)
        artifact = find_artifact(model_dir, version)
        if input_:
            tables = [parse_tensor(t, require_type=True) for t in input_]
            outs = [parse_tensor(t, require_type=True) for t in output_tensor or ()]

            def tensor(t: dict[str, Any]) -> TensorSig:
                return TensorSig(t["name"], t["dtype"], tuple(-1 if d == -1 else d for d in t["shape"]))

            signature: Signature | None = Signature(
                tuple(tensor(t) for t in tables), tuple(tensor(t) for t in outs), "command line"
            )
        else:
            signature = artifact_signature(artifact)
        if signature is None:
            raise ValueError(
                f"{artifact} carries no signature this tool can read; describe it with --input and --output-tensor"
            )
        mbs = max_batch_size if max_batch_size is not None else (signature.max_batch_size or 0)
        batching_on = dynamic_batching if dynamic_batching is not None else mbs > 0
        groups: tuple[InstanceGroup, ...] = ()
        if instance_count is not None or instance_kind is not None:
            kind = instance_kind.value if instance_kind is not None else InstanceKind.KIND_AUTO.value
            groups = (InstanceGroup(instance_count or 1, kind),)
        options = ConfigOptions(
            max_batch_size=mbs,
            dynamic_batching=DynamicBatching(tuple(preferred_batch_size or ()), max_queue_delay_us)
            if batching_on
            else None,
            instance_groups=groups,
            parameters=parse_pairs(parameter, "--parameter"),
            warmup=warmup,
            warmup_sizes={k: int(v) for k, v in parse_pairs(warmup_size, "--warmup-size").items()},
            graph_optimization_level=graph_optimization_level,
            accelerator=accelerator,
            accelerator_parameters=parse_pairs(accelerator_parameter, "--accelerator-parameter"),
        )
        platform = PLATFORM_OF_FILE[artifact.name]
        config = signature_config(name or model_dir.name, platform, signature, options)
    for warning in unknown_parameters(platform[1], options.parameters):
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    if stdout:
        typer.echo(model_config.to_text(config), nl=False)
        return
    if (model_dir / CONFIG_FILE).exists() and not force:
        raise fail(f"{model_dir / CONFIG_FILE} exists; --force overwrites it, --stdout prints instead")
    path = model_config.write(config, model_dir)
    validate_written(model_dir.parent, [model_dir.name])
    console.print(f"[green]✓[/] {path} (from the {signature.source}, max_batch_size {mbs})", highlight=False)
    if mbs == 0 and all(t.shape and t.is_dynamic(0) for t in (*signature.inputs, *signature.outputs)):
        console.print("  every tensor starts with a dynamic axis: --max-batch-size N lets Triton batch them")
