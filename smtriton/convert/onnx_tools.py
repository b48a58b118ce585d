"""ONNX graph rewrites shared by the exporter and the TensorRT builder: simplification, FP16 cast, save.

No torch here: the TensorRT build runs inside the serving image, which has no PyTorch.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx

from smtriton.errors import ToolError


class OnnxToolError(ToolError, RuntimeError):
    """A rewrite could not run (missing optional dependency) or produced an invalid graph."""


def simplify(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant folding and redundant-node removal: onnxslim if installed, else onnxsim."""
    try:
        import onnxslim
    except ImportError:
        onnxslim = None
    if onnxslim is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return onnxslim.slim(model)
    try:
        import onnxsim
    except ImportError:
        raise OnnxToolError(
            "graph simplification needs onnxslim or onnxsim: pip install onnxslim (or smtriton[convert])"
        ) from None
    simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise OnnxToolError("onnxsim could not validate the simplified graph")
    return simplified


def cast_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """FP32 weights and compute to FP16, graph inputs and outputs kept FP32 (casts at the boundary).

    Uses ONNX Runtime's converter (``onnxruntime.transformers.float16``), which keeps ops that have no
    FP16 kernel in FP32 and clamps constants to FP16's range.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "values truncated to FP16 range" notes: parity decides
        converted = OnnxModel(convert_float_to_float16(model, keep_io_types=True))
    converted.topological_sort()  # the converter appends its boundary Casts after their consumers
    return converted.model


_PROTOBUF_LIMIT = 2**31 - 1


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write the model; weights go to ``<name>.data`` beside it when the file would pass protobuf's 2 GB."""
    if model.ByteSize() < _PROTOBUF_LIMIT:
        onnx.save(model, str(path))
    else:  # pragma: no cover - needs a >2 GB model
        onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
