"""PyTorch -> ONNX with named inputs/outputs and named dynamic axes, checked and run with ONNX Runtime.

The exporter is chosen explicitly per model (recipe ``export.dynamo``): since torch 2.9 the default is
the torch.export-based exporter, which treats dynamic axes differently and, on torch 2.13, exports at
opset 18 and converts the graph down to a lower requested opset (onnxscript and onnx-ir at the
versions pyproject.toml names). ``dynamo = false`` (the TorchScript-based exporter) is the default
here because it exports the demo models with dynamic batch and sequence axes at the requested opset
directly.

After export, optionally (recipe ``export.simplify`` / ``export.fp16``, or ``smtriton convert onnx
--simplify --fp16``): the graph is simplified with onnxslim (or onnxsim), and cast to FP16 with its
inputs and outputs kept FP32 — the form TensorRT 11, which only builds strongly typed networks, needs
for an FP16 engine. The parity check then runs on the final file.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch

from smtriton.convert.export import ExportError, Runner, quiet_tracing_logs
from smtriton.convert.onnx_tools import OnnxToolError, cast_fp16, save, simplify
from smtriton.convert.recipe import ModelSpec, TensorSpec
from smtriton.convert.torch_model import to_tensors
from smtriton.repo.artifacts import ONNX_SIGNATURE_KEY, SignatureError, TensorSig, onnx_signature, signature_json


class OnnxExporter:
    format = "onnx"
    filename = "model.onnx"

    def export(
        self,
        module: torch.nn.Module,
        spec: ModelSpec,
        outputs: Sequence[TensorSpec],
        example: Mapping[str, np.ndarray],
        path: Path,
    ) -> None:
        tensors = (*spec.inputs, *outputs)
        dynamic_axes = {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in tensors if t.axes}
        with warnings.catch_warnings(), torch.no_grad(), quiet_tracing_logs():
            # Tracer and deprecation warnings: the parity check at several sizes is the real test.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                to_tensors(spec, example),
                str(path),
                input_names=[t.name for t in spec.inputs],
                output_names=[t.name for t in outputs],
                dynamic_axes=dynamic_axes,
                opset_version=spec.export.opset,
                do_constant_folding=True,
                dynamo=spec.export.dynamo,
                verbose=False,  # the dynamo exporter prints its progress otherwise
            )
        if spec.export.dynamo:
            check_opset(path, spec.export.opset)
        if spec.export.simplify or spec.export.fp16:
            model = onnx.load(str(path))
            try:
                if spec.export.simplify:
                    model = simplify(model)
                if spec.export.fp16:
                    model = cast_fp16(model)
            except OnnxToolError as exc:
                raise ExportError(str(exc)) from None
            save(model, path)
        check_signature(path, spec.inputs, outputs)
        record_signature(path, spec, outputs)

    def load(self, spec: ModelSpec, outputs: Sequence[TensorSpec], path: Path) -> Runner:
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [t.name for t in outputs]

        def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            feeds = {t.name: np.ascontiguousarray(inputs[t.name]) for t in spec.inputs}
            return dict(zip(names, session.run(names, feeds), strict=True))

        return run


def check_opset(path: Path, requested: int) -> None:
    """The torch.export-based exporter keeps its own opset when converting down fails, with a warning
    only: a graph at another opset than the one asked for is refused, saying what to ask for."""
    model = onnx.load(str(path), load_external_data=False)
    written = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), requested)
    if written != requested:
        raise ExportError(
            f"the torch.export-based exporter wrote opset {written} and could not convert this graph to the "
            f"requested opset {requested}: ask for opset {written} (--opset {written}), or export without --dynamo"
        )


def record_signature(path: Path, spec: ModelSpec, outputs: Sequence[TensorSpec]) -> None:
    """Store what the conversion decided (axis names, max_batch_size) in the graph's metadata, so
    `smtriton config` generates the batching the model was exported for, wherever the file goes."""
    model = onnx.load(str(path), load_external_data=False)  # external weights stay where they are
    signature = signature_json(
        [TensorSig(t.name, t.dtype, t.shape) for t in spec.inputs],
        [TensorSig(t.name, t.dtype, t.shape) for t in outputs],
        spec.max_batch_size,
    )
    kept = [p for p in model.metadata_props if p.key != ONNX_SIGNATURE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=ONNX_SIGNATURE_KEY, value=signature)
    onnx.save(model, str(path))


def graph_signature(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(name, Triton dtype) of the graph's inputs and outputs, read without loading weights."""
    try:
        signature = onnx_signature(path)
    except SignatureError as exc:
        raise ExportError(f"{path.name}: {exc}") from None
    return [(t.name, t.dtype) for t in signature.inputs], [(t.name, t.dtype) for t in signature.outputs]


def check_signature(path: Path, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
    """The graph must declare exactly the recipe's inputs and outputs, in order, with their dtypes."""
    onnx.checker.check_model(str(path))
    graph_in, graph_out = graph_signature(path)
    for kind, graph, wanted in (("inputs", graph_in, inputs), ("outputs", graph_out, outputs)):
        expected = [(t.name, t.dtype) for t in wanted]
        if graph != expected:
            raise ExportError(
                f"{path.name}: graph {kind} {graph} differ from the recipe's {expected} "
                "(an unused input is dropped by the exporter; a dtype may need a cast in the wrapper)"
            )
