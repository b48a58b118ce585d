"""The GPU tests' model: a small seeded encoder, as an ONNX model and as the numpy answer it must give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class Encoder:
    """ids[batch, sequence] INT64 -> relu(table[ids] @ w1) @ w2, FP32 [batch, sequence, 16], seeded: the same
    weights make the ONNX model and the answer computed here."""

    def __init__(self, rows: int = 100, width: int = 16) -> None:
        rng = np.random.default_rng(0)
        self.rows = rows
        self.table = rng.standard_normal((rows, width), dtype=np.float32)
        self.w1 = (rng.standard_normal((width, 16), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        self.w2 = (rng.standard_normal((16, 16), dtype=np.float32) / 4).astype(np.float32)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return np.maximum(self.table[ids] @ self.w1, 0) @ self.w2

    def onnx_model(self) -> Any:
        """The ONNX model: Gather, MatMul, Relu, MatMul, opset 17."""
        from onnx import TensorProto, helper, numpy_helper

        graph = helper.make_graph(
            [
                helper.make_node("Gather", ["table", "ids"], ["emb"]),
                helper.make_node("MatMul", ["emb", "w1"], ["h1"]),
                helper.make_node("Relu", ["h1"], ["a1"]),
                helper.make_node("MatMul", ["a1", "w2"], ["hidden"]),
            ],
            "encoder",
            [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
            [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", 16])],
            [numpy_helper.from_array(a, n) for n, a in (("table", self.table), ("w1", self.w1), ("w2", self.w2))],
        )
        # IR version 8 (what opset 17 needs): the ONNX Runtime of an older Triton image refuses newer ones.
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def write_onnx(self, model_dir: Path, kind: str = "KIND_GPU") -> Path:
        """A Triton model directory serving it on ONNX Runtime."""
        from onnx import save

        (model_dir / "1").mkdir(parents=True)
        save(self.onnx_model(), str(model_dir / "1" / "model.onnx"))
        (model_dir / "config.pbtxt").write_text(
            f'name: "{model_dir.name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
            'input [{ name: "ids", data_type: TYPE_INT64, dims: [-1, -1] }]\n'
            'output [{ name: "hidden", data_type: TYPE_FP32, dims: [-1, -1, 16] }]\n'
            f"instance_group [{{ kind: {kind}, count: 1 }}]\n"
        )
        return model_dir
