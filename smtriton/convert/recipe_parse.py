"""Reading and checking a recipe file: every key, type and cross-reference, each refusal naming the file
and the model. It also resolves the code a recipe names; like :mod:`smtriton.convert.recipe` it imports
neither torch nor protobuf.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from smtriton import dtypes
from smtriton.convert.recipe import (
    BATCH_AXIS,
    COMMAND_LINE,
    DEFAULT_AXIS_SIZES,
    DEFAULT_RECIPE,
    DYNAMO_OPSET,
    FORMATS,
    FP16_PARITY,
    INSTANCE_KINDS,
    Dim,
    DynamicBatching,
    EnsembleStep,
    ExportOptions,
    InstanceGroup,
    ModelSpec,
    OutputSpec,
    ParityOptions,
    Recipe,
    RecipeError,
    TensorRTOptions,
    TensorSpec,
    dependencies,
)
from smtriton.convert.tensorrt_profiles import HARDWARE_LEVELS, PRECISIONS, TOLERANCES, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_AXIS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_TORCHSCRIPT_NAME = re.compile(r"^.+__(\d+)$")


def load_recipe(path: str | Path = DEFAULT_RECIPE) -> Recipe:
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    return parse_recipe(data, path)


def parse_recipe(data: Mapping[str, Any], path: Path) -> Recipe:
    """Check a loaded recipe; relative paths and local factories resolve against ``path``'s directory."""
    origin, base_dir = str(path), path.parent
    _check_keys(data, {"model"}, origin)
    tables = data.get("model")
    if not isinstance(tables, list) or not tables:
        raise RecipeError(f"{origin}: needs at least one [[model]] table")
    models: list[ModelSpec] = []
    for index, table in enumerate(tables):
        if not isinstance(table, dict):
            raise RecipeError(f"{origin}: model #{index + 1} is not a table")
        name = table.get("name")
        where = f"{origin}: model {name!r}" if isinstance(name, str) else f"{origin}: model #{index + 1}"
        spec = model_from_table(table, base_dir, where)
        if spec.name in {m.name for m in models}:
            raise RecipeError(f"{where}: duplicate model name")
        models.append(spec)
    by_name = {m.name: m for m in models}
    for index, spec in enumerate(models):
        models[index] = _resolve_references(spec, by_name, f"{origin}: model {spec.name!r}")
    _check_no_cycle(models, origin)
    return Recipe(path=path, models=tuple(models))


def _resolve_references(spec: ModelSpec, models: Mapping[str, ModelSpec], where: str) -> ModelSpec:
    """Check the models an entry names; a TensorRT entry takes its ONNX entry's batching unless it sets its own."""
    if spec.format == "ensemble":
        for number, step in enumerate(spec.steps, 1):
            if step.model not in models:
                raise RecipeError(
                    f"{where}: step {number} names model {step.model!r}, which this recipe does not list "
                    f"(models: {', '.join(models)})"
                )
        return spec
    if spec.format != "tensorrt":
        return spec
    source = models.get(str(spec.onnx))
    if source is None or source.format != "onnx":
        onnx_entries = ", ".join(m.name for m in models.values() if m.format == "onnx") or "none"
        raise RecipeError(f"{where}: `onnx` must name an ONNX entry of this recipe ({onnx_entries}), not {spec.onnx!r}")
    if "max_batch_size" not in spec.raw:
        mbs = source.max_batch_size
        batching = _parse_batching(spec.raw.get("dynamic_batching"), mbs, where)
        spec = replace(spec, max_batch_size=mbs, dynamic_batching=batching)
    _check_profile_bounds(spec, source, where)
    return spec


def _check_profile_bounds(spec: ModelSpec, source: ModelSpec, where: str) -> None:
    """Every dynamic axis of the ONNX entry's inputs needs the bounds the plan accepts, but the batch
    axis, which is 1..max_batch_size; a profile axis no input has is a typo."""
    assert spec.tensorrt is not None
    bounds = spec.tensorrt.profile
    batching = spec.max_batch_size > 0
    if batching and BATCH_AXIS in bounds:
        raise RecipeError(f"{where}: tensorrt.profile: the batch axis is 1..max_batch_size; leave it out")
    used: dict[str, str] = {}
    for tensor in source.inputs:
        for axis in tensor.axes:
            used.setdefault(axis, tensor.name)
    for axis, tensor_name in used.items():
        if axis not in bounds and not (batching and axis == BATCH_AXIS):
            raise RecipeError(
                f"{where}: tensorrt.profile has no bounds for axis {axis!r} (input {tensor_name!r} of "
                f"{source.name!r}), which the plan must know: add profile = {{ {axis} = [min, opt, max] }} "
                f"(the sizes it accepts; {source.name!r}'s axes are only the parity check's sizes)"
            )
    for axis in bounds:
        if axis not in used:
            raise RecipeError(f"{where}: tensorrt.profile names axis {axis!r}, which no input of {source.name!r} has")


def _check_no_cycle(models: Sequence[ModelSpec], origin: str) -> None:
    """An ensemble may use another ensemble, but no model may end up built from itself."""
    by_name = {m.name: m for m in models}
    for spec in models:
        pending = [(spec.name, [spec.name])]
        while pending:
            name, path = pending.pop()
            for dependency in dependencies(by_name[name]):
                if dependency == spec.name:
                    raise RecipeError(
                        f"{origin}: model {spec.name!r} is built from itself: {' -> '.join([*path, dependency])}"
                    )
                if dependency not in path:
                    pending.append((dependency, [*path, dependency]))


_MODEL_KEYS = {
    "name", "format", "factory", "seed", "checkpoint", "source", "max_batch_size", "input", "output",
    "axes", "dynamic_batching", "instance_group", "parameters", "export", "parity", "samples",
}  # fmt: skip
_ENSEMBLE_KEYS = {"name", "format", "max_batch_size", "input", "output", "axes", "step", "parity", "samples"}
_TENSORRT_KEYS = {
    "name", "format", "onnx", "max_batch_size", "tensorrt", "dynamic_batching", "instance_group", "parameters",
    "parity",
}  # fmt: skip


def _check_origin(t: Mapping[str, Any], fmt: str, factory: str | None, source: str | None, where: str) -> None:
    """Python models come from a `source` file; every other format from a torch `factory`."""
    if fmt == "python":
        if source is None:
            raise RecipeError(f"{where}: python models need `source` (a module or a .py path)")
        for key in ("factory", "checkpoint", "seed", "export", "parity"):
            if key in t:
                raise RecipeError(f"{where}: `{key}` does not apply to python models")
    else:
        if factory is None or not _FACTORY.match(factory):
            raise RecipeError(f"{where}: `factory` must be 'package.module:function'")
        if source is not None:
            raise RecipeError(f"{where}: `source` is for python models only")


def _check_tensor_names(kind: str, names: list[str], fmt: str, where: str) -> None:
    """Unique names; for TorchScript, the PyTorch backend's positional NAME__index names."""
    if len(set(names)) != len(names):
        raise RecipeError(f"{where}: duplicate {kind} names")
    if fmt != "torchscript":
        return
    for position, tensor_name in enumerate(names):
        m = _TORCHSCRIPT_NAME.match(tensor_name)
        if not m or int(m.group(1)) != position:
            raise RecipeError(
                f"{where}: TorchScript {kind} #{position + 1} must be named like "
                f"{kind.upper()}__{position} (the PyTorch backend's NAME__index convention)"
            )


def _check_batch_axis(shapes: list[tuple[Dim, ...]], max_batch_size: int, where: str) -> None:
    """The batch axis is Triton's first dimension: first in every shape when batching, nowhere else."""
    if max_batch_size > 0:
        for shape in shapes:
            if not shape or shape[0] != BATCH_AXIS:
                raise RecipeError(
                    f"{where}: with max_batch_size > 0 every shape must start with {BATCH_AXIS!r} "
                    f"(Triton's batch dimension), got {list(shape)}"
                )
    for shape in shapes:
        if BATCH_AXIS in shape[1:]:
            raise RecipeError(f"{where}: axis {BATCH_AXIS!r} may only be the first dimension")


def model_from_table(t: Mapping[str, Any], base_dir: Path, where: str) -> ModelSpec:
    """One ``[[model]]`` table, checked; ``where`` prefixes every error. Command-line conversions build
    such a table from their options, so a model named on the command line obeys the recipe's rules."""
    name = _get(t, "name", str, where)
    if not _NAME.match(name):
        raise RecipeError(f"{where}: name must match {_NAME.pattern} (it is a directory name)")
    fmt = _get(t, "format", str, where)
    if fmt not in FORMATS:
        raise RecipeError(f"{where}: format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "ensemble":
        return _ensemble_from_table(t, base_dir, where)
    if fmt == "tensorrt":
        return _tensorrt_from_table(t, base_dir, where)
    _check_keys(t, _MODEL_KEYS, f"{where} (format {fmt})")

    factory = _get(t, "factory", str, where, None)
    source = _get(t, "source", str, where, None)
    checkpoint = _get(t, "checkpoint", str, where, None)
    _check_origin(t, fmt, factory, source, where)

    max_batch_size = _get(t, "max_batch_size", int, where, 0)
    if max_batch_size < 0:
        raise RecipeError(f"{where}: max_batch_size must be >= 0")

    from_flags = where == COMMAND_LINE
    inputs = tuple(
        _parse_input(x, f"{where}: input #{i + 1}", from_flags) for i, x in enumerate(_tables(t, "input", where))
    )
    outputs = tuple(
        _parse_output(x, f"{where}: output #{i + 1}", required=fmt == "python")
        for i, x in enumerate(_tables(t, "output", where))
    )
    if not inputs or not outputs:
        raise RecipeError(f"{where}: needs at least one [[model.input]] and one [[model.output]]")
    for kind, names in (("input", [x.name for x in inputs]), ("output", [x.name for x in outputs])):
        _check_tensor_names(kind, names, fmt, where)

    shapes = [x.shape for x in inputs] + [x.shape for x in outputs if x.shape is not None]
    used_axes = list(dict.fromkeys(d for shape in shapes for d in shape if isinstance(d, str)))
    _check_batch_axis(shapes, max_batch_size, where)

    axes = _parse_axes(t.get("axes", {}), used_axes, max_batch_size, where)
    export = _parse_export(t.get("export", {}), fmt, where)
    return ModelSpec(
        name=name,
        format=fmt,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        axes=axes,
        dynamic_batching=_parse_batching(t.get("dynamic_batching"), max_batch_size, where),
        instance_groups=tuple(_parse_instance_group(x, where) for x in _tables(t, "instance_group", where)),
        parameters=_parse_parameters(t.get("parameters", {}), where),
        export=export,
        parity=_parse_parity(t.get("parity", {}), where, FP16_PARITY if export.fp16 else ParityOptions()),
        base_dir=base_dir,
        factory=factory,
        seed=_get(t, "seed", int, where, 0),
        checkpoint=(base_dir / checkpoint) if checkpoint else None,
        source=source,
        samples=_parse_samples(t, where),
        raw=dict(t),
        from_flags=from_flags,
    )


def _parse_samples(t: Mapping[str, Any], where: str) -> str | None:
    samples = _get(t, "samples", str, where, None)
    if samples is not None and not _FACTORY.match(samples):
        raise RecipeError(f"{where}: `samples` must be 'package.module:function'")
    return samples


def _ensemble_from_table(t: Mapping[str, Any], base_dir: Path, where: str) -> ModelSpec:
    """An ensemble: inputs declared, outputs by name (dtype and shape come from the step that writes
    them, checked when declared), steps naming recipe models."""
    _check_keys(t, _ENSEMBLE_KEYS, f"{where} (format ensemble)")
    max_batch_size = _get(t, "max_batch_size", int, where, 0)
    if max_batch_size < 0:
        raise RecipeError(f"{where}: max_batch_size must be >= 0")
    inputs = tuple(_parse_input(x, f"{where}: input #{i + 1}") for i, x in enumerate(_tables(t, "input", where)))
    outputs = tuple(
        _parse_output(x, f"{where}: output #{i + 1}", required=False) for i, x in enumerate(_tables(t, "output", where))
    )
    if not inputs or not outputs:
        raise RecipeError(f"{where}: needs at least one [[model.input]] and one [[model.output]]")
    for kind, names in (("input", [x.name for x in inputs]), ("output", [x.name for x in outputs])):
        _check_tensor_names(kind, names, "ensemble", where)
    steps = tuple(_parse_step(x, where, i + 1) for i, x in enumerate(_tables(t, "step", where)))
    if not steps:
        raise RecipeError(f"{where}: an ensemble needs at least one [[model.step]]")
    for number, step in enumerate(steps, 1):
        if step.model == t["name"]:
            raise RecipeError(f"{where}: step {number} names the ensemble itself")
    shapes = [x.shape for x in inputs] + [x.shape for x in outputs if x.shape is not None]
    used_axes = list(dict.fromkeys(d for shape in shapes for d in shape if isinstance(d, str)))
    _check_batch_axis(shapes, max_batch_size, where)
    return ModelSpec(
        name=t["name"],
        format="ensemble",
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        axes=_parse_axes(t.get("axes", {}), used_axes, max_batch_size, where),
        dynamic_batching=None,
        instance_groups=(),
        parameters={},
        export=ExportOptions(),
        parity=_parse_parity(t.get("parity", {}), where, ParityOptions()),
        base_dir=base_dir,
        samples=_parse_samples(t, where),
        steps=steps,
        raw=dict(t),
    )


def _parse_step(t: Mapping[str, Any], where: str, number: int) -> EnsembleStep:
    where = f"{where}: step {number}"
    _check_keys(t, {"model", "input_map", "output_map", "version"}, where)
    model = _get(t, "model", str, where)
    where = f"{where} ({model})"
    maps = []
    for key in ("input_map", "output_map"):
        value = _get(t, key, dict, where)
        if not value or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()):
            raise RecipeError(
                f"{where}: `{key}` must be a non-empty table of the model's tensor = the ensemble's tensor name"
            )
        maps.append(dict(value))
    version = _get(t, "version", int, where, -1)
    if version == 0 or version < -1:
        raise RecipeError(f"{where}: version is a model version (>= 1) or -1 for the one Triton serves")
    return EnsembleStep(model, maps[0], maps[1], version)


def _tensorrt_from_table(t: Mapping[str, Any], base_dir: Path, where: str) -> ModelSpec:
    """A TensorRT plan built from the recipe's ONNX entry `onnx`: its I/O are the engine's, its profile
    comes from that entry's axes; batching is the entry's unless set here (resolved with the recipe)."""
    _check_keys(t, _TENSORRT_KEYS, f"{where} (format tensorrt)")
    onnx = _get(t, "onnx", str, where)
    max_batch_size = _get(t, "max_batch_size", int, where, 0)
    if max_batch_size < 0:
        raise RecipeError(f"{where}: max_batch_size must be >= 0")
    options = _parse_tensorrt(t.get("tensorrt", {}), where)
    atol, rtol = TOLERANCES[options.precision]
    groups = tuple(_parse_instance_group(x, where) for x in _tables(t, "instance_group", where))
    return ModelSpec(
        name=t["name"],
        format="tensorrt",
        inputs=(),
        outputs=(),
        max_batch_size=max_batch_size,
        axes={},
        dynamic_batching=_parse_batching(t.get("dynamic_batching"), max_batch_size, where),
        instance_groups=groups or (InstanceGroup(1, "KIND_GPU"),),
        parameters=_parse_parameters(t.get("parameters", {}), where),
        export=ExportOptions(),
        parity=_parse_parity(t.get("parity", {}), where, ParityOptions(trials=2, atol=atol, rtol=rtol)),
        base_dir=base_dir,
        onnx=onnx,
        tensorrt=options,
        raw=dict(t),
    )


def _parse_tensorrt(t: Any, where: str) -> TensorRTOptions:
    where = f"{where}: tensorrt"
    if not isinstance(t, dict):
        raise RecipeError(f"{where}: must be a table")
    _check_keys(t, {"precision", "workspace", "optimization_level", "version_compatible", "hardware_compatibility",
                    "profile"}, where)  # fmt: skip
    options = TensorRTOptions(
        precision=_get(t, "precision", str, where, "fp32"),
        workspace=_get(t, "workspace", str, where, None),
        optimization_level=_get(t, "optimization_level", int, where, None),
        version_compatible=_get(t, "version_compatible", bool, where, False),
        hardware_compatibility=_get(t, "hardware_compatibility", str, where, "none"),
        profile=_parse_profile(_get(t, "profile", dict, where, {}), f"{where}.profile"),
    )
    if options.precision not in PRECISIONS:
        raise RecipeError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, not {options.precision!r}")
    if options.hardware_compatibility not in HARDWARE_LEVELS:
        raise RecipeError(f"{where}: hardware_compatibility must be one of {', '.join(HARDWARE_LEVELS)}")
    if options.workspace is not None:
        try:
            parse_size(options.workspace)
        except ValueError as exc:
            raise RecipeError(f"{where}: workspace {exc}") from None
    if options.optimization_level is not None and not 0 <= options.optimization_level <= 5:
        raise RecipeError(f"{where}: optimization_level is 0..5")
    return options


def _parse_profile(t: Mapping[str, Any], where: str) -> dict[str, tuple[int, int, int]]:
    profile: dict[str, tuple[int, int, int]] = {}
    for axis, sizes in t.items():
        if (
            not isinstance(sizes, list)
            or len(sizes) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes)
        ):
            raise RecipeError(f"{where}: {axis} is [min, opt, max], three positive sizes")
        if not sizes[0] <= sizes[1] <= sizes[2]:
            raise RecipeError(f"{where}: {axis} needs min <= opt <= max, got {sizes}")
        profile[str(axis)] = (sizes[0], sizes[1], sizes[2])
    return profile


def _parse_input(t: Mapping[str, Any], where: str, from_flags: bool = False) -> TensorSpec:
    _check_keys(t, {"name", "dtype", "shape", "range"}, where)
    name = _get(t, "name", str, where)
    where = f"{where.rsplit(':', 1)[0]}: input {name!r}"
    dtype = _parse_dtype(_get(t, "dtype", str, where), where)
    shape = _parse_shape(_get(t, "shape", list, where), where)
    value_range = t.get("range")
    if dtype in dtypes.INTEGER:
        if (
            not isinstance(value_range, list)
            or len(value_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value_range)
            or value_range[0] >= value_range[1]
        ):
            if from_flags:
                raise RecipeError(
                    f"{where}: integer inputs need their values' range, LOW..HIGH with LOW < HIGH (HIGH excluded), "
                    f"e.g. --input {name}:{dtype}:{','.join(map(str, shape))}:0..30522"
                )
            raise RecipeError(f"{where}: integer inputs need range = [low, high) with low < high")
        return TensorSpec(name, dtype, shape, (value_range[0], value_range[1]))
    if value_range is not None:
        raise RecipeError(f"{where}: range applies to integer inputs only")
    return TensorSpec(name, dtype, shape)


def _parse_output(t: Mapping[str, Any], where: str, required: bool) -> OutputSpec:
    _check_keys(t, {"name", "dtype", "shape"}, where)
    name = _get(t, "name", str, where)
    where = f"{where.rsplit(':', 1)[0]}: output {name!r}"
    dtype = _get(t, "dtype", str, where, None)
    shape = _get(t, "shape", list, where, None)
    if required and (dtype is None or shape is None):
        raise RecipeError(f"{where}: python models must declare output dtype and shape")
    return OutputSpec(
        name,
        _parse_dtype(dtype, where) if dtype is not None else None,
        _parse_shape(shape, where) if shape is not None else None,
    )


def _parse_dtype(value: str, where: str) -> str:
    if value not in dtypes.BUILD_DTYPES:
        raise RecipeError(f"{where}: dtype must be one of {', '.join(dtypes.BUILD_DTYPES)}, not {value!r}")
    return value


def _parse_shape(value: list[Any], where: str) -> tuple[Dim, ...]:
    shape: list[Dim] = []
    for d in value:
        if isinstance(d, bool) or not ((isinstance(d, int) and d > 0) or (isinstance(d, str) and _AXIS.match(d))):
            raise RecipeError(f"{where}: shape entries are positive ints or axis names, got {d!r}")
        shape.append(d)
    if not shape:
        raise RecipeError(f"{where}: shape must not be empty")
    return tuple(shape)


def _parse_axes(t: Any, used: Sequence[str], max_batch_size: int, where: str) -> dict[str, tuple[int, ...]]:
    if not isinstance(t, dict):
        raise RecipeError(f"{where}: [model.axes] must be a table of axis = [sizes]")
    unknown = set(t) - set(used)
    if unknown:
        raise RecipeError(f"{where}: [model.axes] names axes no shape uses: {', '.join(sorted(unknown))}")
    axes: dict[str, tuple[int, ...]] = {}
    for axis in used:
        sizes = t.get(axis, list(DEFAULT_AXIS_SIZES))
        if axis == BATCH_AXIS and axis not in t and max_batch_size > 0:
            sizes = sorted({min(s, max_batch_size) for s in sizes})
        if (
            not isinstance(sizes, list)
            or not sizes
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
        ):
            raise RecipeError(f"{where}: axes.{axis} must be a non-empty list of positive ints")
        if axis == BATCH_AXIS and max_batch_size > 0 and max(sizes) > max_batch_size:
            raise RecipeError(f"{where}: axes.batch sizes must not exceed max_batch_size {max_batch_size}")
        axes[axis] = tuple(sizes)
    return axes


def _parse_batching(value: Any, max_batch_size: int, where: str) -> DynamicBatching | None:
    if value is None:  # on by default whenever Triton may batch
        return DynamicBatching() if max_batch_size > 0 else None
    if value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: dynamic_batching is a table or a boolean")
    if max_batch_size == 0:
        raise RecipeError(f"{where}: dynamic batching needs max_batch_size > 0")
    where = f"{where}: dynamic_batching"
    _check_keys(value, {"preferred_batch_size", "max_queue_delay_microseconds"}, where)
    preferred = _get(value, "preferred_batch_size", list, where, [])
    if not all(isinstance(s, int) and 0 < s <= max_batch_size for s in preferred):
        raise RecipeError(f"{where}: preferred_batch_size entries must be in 1..max_batch_size")
    delay = _get(value, "max_queue_delay_microseconds", int, where, 0)
    if delay < 0:
        raise RecipeError(f"{where}: max_queue_delay_microseconds must be >= 0")
    return DynamicBatching(tuple(preferred), delay)


def _parse_instance_group(t: Mapping[str, Any], where: str) -> InstanceGroup:
    where = f"{where}: instance_group"
    _check_keys(t, {"count", "kind"}, where)
    count = _get(t, "count", int, where, 1)
    kind = _get(t, "kind", str, where, "KIND_CPU")
    if count < 1 or kind not in INSTANCE_KINDS:
        raise RecipeError(f"{where}: count >= 1 and kind in {', '.join(INSTANCE_KINDS)}")
    return InstanceGroup(count, kind)


def _parse_parameters(t: Any, where: str) -> dict[str, str]:
    if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
        raise RecipeError(f"{where}: [model.parameters] values must be strings (Triton parameters are)")
    return dict(t)


def _parse_export(t: Any, fmt: str, where: str) -> ExportOptions:
    where = f"{where}: export"
    if not isinstance(t, dict):
        raise RecipeError(f"{where}: must be a table")
    allowed = {"onnx": {"opset", "dynamo", "simplify", "fp16"}, "torchscript": {"method", "freeze"}}.get(fmt, set())
    _check_keys(t, allowed, f"{where} (format {fmt})")
    dynamo = _get(t, "dynamo", bool, where, ExportOptions.dynamo)
    options = ExportOptions(
        opset=_get(t, "opset", int, where, DYNAMO_OPSET if dynamo else ExportOptions.opset),
        dynamo=dynamo,
        method=_get(t, "method", str, where, ExportOptions.method),
        freeze=_get(t, "freeze", bool, where, ExportOptions.freeze),
        simplify=_get(t, "simplify", bool, where, ExportOptions.simplify),
        fp16=_get(t, "fp16", bool, where, ExportOptions.fp16),
    )
    if options.method not in ("trace", "script"):
        raise RecipeError(f"{where}: method is 'trace' or 'script'")
    if options.opset < 7:
        raise RecipeError(f"{where}: opset must be >= 7")
    return options


def _parse_parity(t: Any, where: str, defaults: ParityOptions) -> ParityOptions:
    where = f"{where}: parity"
    if not isinstance(t, dict):
        raise RecipeError(f"{where}: must be a table")
    _check_keys(t, {"trials", "atol", "rtol"}, where)
    options = ParityOptions(
        trials=_get(t, "trials", int, where, defaults.trials),
        atol=float(_get(t, "atol", (int, float), where, defaults.atol)),
        rtol=float(_get(t, "rtol", (int, float), where, defaults.rtol)),
    )
    if options.trials < 1 or options.atol < 0 or options.rtol < 0:
        raise RecipeError(f"{where}: trials >= 1, atol >= 0, rtol >= 0")
    return options


def _tables(t: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    value = t.get(key, [])
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise RecipeError(f"{where}: `{key}` must be an array of tables ([[model.{key}]])")
    return value


_MISSING = object()


def _get(t: Mapping[str, Any], key: str, kind: Any, where: str, default: Any = _MISSING) -> Any:
    if key not in t:
        if default is _MISSING:
            raise RecipeError(f"{where}: missing `{key}`")
        return default
    value = t[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RecipeError(f"{where}: `{key}` has the wrong type ({type(value).__name__})")
    return value


def _check_keys(t: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(t) - allowed)
    if unknown:
        hint = f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""
        raise RecipeError(f"{where}: unknown key(s) {', '.join(unknown)}{hint}")
