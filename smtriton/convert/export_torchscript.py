"""PyTorch -> TorchScript ``model.pt`` for Triton's PyTorch backend (trace or script, then freeze).

TorchScript is deprecated in recent PyTorch but is what ``pytorch_libtorch`` loads; this exporter sits
behind :class:`smtriton.convert.export.Exporter` so an AOTInductor exporter can sit beside it.

A TorchScript file records no input shapes or dtypes, so the recipe's signature (inputs, probed
outputs, max_batch_size) is stored inside ``model.pt`` as an extra file; ``smtriton config`` and
``smtriton validate`` read it back (:mod:`smtriton.repo.artifacts`). ``torch.jit.load`` ignores it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from smtriton.convert.export import ExportError, Runner, quiet_tracing_logs
from smtriton.convert.recipe import ModelSpec, TensorSpec
from smtriton.convert.torch_model import output_list, to_tensors
from smtriton.repo.artifacts import TORCHSCRIPT_SIGNATURE, TensorSig, signature_json


class TorchScriptExporter:
    format = "torchscript"
    filename = "model.pt"

    def export(
        self,
        module: torch.nn.Module,
        spec: ModelSpec,
        outputs: Sequence[TensorSpec],
        example: Mapping[str, np.ndarray],
        path: Path,
    ) -> None:
        with warnings.catch_warnings(), torch.no_grad(), quiet_tracing_logs():
            warnings.simplefilter("ignore")  # tracer warnings: the parity check decides
            try:
                if spec.export.method == "script":
                    scripted = torch.jit.script(module)
                else:
                    # check_trace off: it reruns the model once more; parity runs it at several sizes.
                    scripted = torch.jit.trace(module, to_tensors(spec, example), check_trace=False)
                if spec.export.freeze:
                    scripted = torch.jit.freeze(scripted.eval())
            except Exception as exc:  # torch raises many types here; keep the cause attached
                raise ExportError(f"TorchScript {spec.export.method} failed: {exc}") from exc
            signature = signature_json(
                [TensorSig(t.name, t.dtype, t.shape) for t in spec.inputs],
                [TensorSig(t.name, t.dtype, t.shape) for t in outputs],
                spec.max_batch_size,
            )
            torch.jit.save(scripted, str(path), _extra_files={TORCHSCRIPT_SIGNATURE: signature})

    def load(self, spec: ModelSpec, outputs: Sequence[TensorSpec], path: Path) -> Runner:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # still what pytorch_libtorch serves
            loaded = torch.jit.load(str(path), map_location="cpu").eval()

        def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.no_grad():
                result = output_list(loaded(*to_tensors(spec, inputs)), spec)
            return {o.name: t.numpy() for o, t in zip(outputs, result, strict=True)}

        return run
