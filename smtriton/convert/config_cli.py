"""``smtriton config``: config.pbtxt from an artifact's own signature, plus batching, instances and
backend options (the config itself is :mod:`smtriton.convert.config`'s)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from smtriton.convert.cli_shared import console, fail, parse_pairs, parse_tensor, validate_written
from smtriton.errors import ToolError


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
        int | None,
        typer.Option(help="ONNX Runtime graph optimization: -1 basic, 1 extended, 2 off (unset or 0: all)."),
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
    from smtriton.convert.config import ConfigOptions, signature_config, unknown_parameters
    from smtriton.convert.recipe import DynamicBatching, InstanceGroup
    from smtriton.model_config import CONFIG_FILE
    from smtriton.repo.artifacts import PLATFORM_OF_FILE, Signature, TensorSig, artifact_signature, find_artifact
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
