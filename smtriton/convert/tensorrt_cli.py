"""``smtriton convert tensorrt``: an ONNX model into a TensorRT plan on this host's GPU, checked, with its
sidecar and config (the build itself is :mod:`smtriton.convert.tensorrt_build`'s)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from smtriton.convert.cli_shared import (
    AtolOpt,
    ConfigFlag,
    MbsOpt,
    ModelOpt,
    OutputOpt,
    RtolOpt,
    VersionOpt,
    console,
    fail,
    validate_written,
)
from smtriton.convert.recipe import DEFAULT_RECIPE, ModelSpec, RecipeError


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


def source_entry(recipe: Path | None, model: str | None, model_dir: Path) -> ModelSpec:
    """The recipe entry whose inputs (their value ranges) and batching the plan takes: ``--model`` of
    ``--recipe``; without ``--recipe``, the entry the source model's directory records it was built from
    (`smtriton convert onnx` and `build-repository` record it, and it travels with the repository into
    the serving image), else the demo recipe of a source checkout."""
    from smtriton.convert.recipe_parse import load_recipe, model_from_table
    from smtriton.convert.stamp import recorded_entry

    if recipe is None:
        table = recorded_entry(model_dir)
        if table is not None and model in (None, table.get("name")):
            return model_from_table(table, model_dir, f"{model_dir}: the recipe entry it was built from")
        if not DEFAULT_RECIPE.is_file():
            recorded = f"records entry {table.get('name')!r}" if table is not None else "records no recipe entry"
            raise RecipeError(f"--model {model}: {model_dir} {recorded}, and no --recipe is given: give --recipe")
    loaded = load_recipe(recipe or DEFAULT_RECIPE)
    try:
        return loaded.model(model) if model else loaded.models[0]
    except KeyError as exc:
        raise RecipeError(str(exc.args[0])) from None


def _calibration_batches(path: Path) -> Callable[[], Iterator[dict[str, Any]]]:
    import numpy as np

    def batches() -> Iterator[dict[str, Any]]:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        count = min(len(a) for a in arrays.values())
        for i in range(count):
            yield {k: a[i] for k, a in arrays.items()}

    return batches


def convert_tensorrt(
    source: Annotated[
        Path,
        typer.Argument(
            metavar="SOURCE", help="model.onnx, or a model directory holding one (highest version).", exists=True
        ),
    ],
    output: OutputOpt,
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
    recipe: Annotated[
        Path | None,
        typer.Option(
            help="Recipe whose --model entry gives input ranges and batching [default: the entry SOURCE was "
            "converted from, which its directory records]."
        ),
    ] = None,
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
    from smtriton.convert import tensorrt_build
    from smtriton.convert.build import staged_dir
    from smtriton.convert.config import ConfigOptions
    from smtriton.convert.recipe import DynamicBatching, InstanceGroup
    from smtriton.convert.tensorrt_profiles import (
        TOLERANCES,
        ProfileError,
        parse_profile,
        parse_size,
        recipe_profile,
        sidecar_path,
    )
    from smtriton.repo.artifacts import SignatureError, find_artifact, onnx_signature

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
            model_dir = source if source.is_dir() else onnx_path.parent.parent
            spec = source_entry(recipe, model, model_dir)
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
        options = tensorrt_build.BuildOptions(
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
                sidecar, report = tensorrt_build.build_checked_plan(
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
            path = model_config.write(tensorrt_build.plan_config(model_name, plan, options_cfg), output / model_name)
            validate_written(output, [model_name])
            console.print(f"  config: {path}", highlight=False)
    except (tensorrt_build.TensorRTError, ProfileError, SignatureError, RecipeError, ValueError) as exc:
        raise fail(str(exc), 1) from None
