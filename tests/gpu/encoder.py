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

    def write_torchscript(self, model_dir: Path, kind: str = "KIND_GPU") -> Path:
        """A Triton model directory serving the same encoder as TorchScript (pytorch_libtorch): INPUT__0 ids
        INT64 [-1, -1], OUTPUT__0 FP32 [-1, -1, 16]."""
        import torch

        class Scripted(torch.nn.Module):
            def __init__(self, table: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> None:
                super().__init__()
                self.register_buffer("table", table)
                self.register_buffer("w1", w1)
                self.register_buffer("w2", w2)

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                return torch.relu(self.table[ids] @ self.w1) @ self.w2

        module = Scripted(*(torch.from_numpy(a.copy()) for a in (self.table, self.w1, self.w2))).eval()
        (model_dir / "1").mkdir(parents=True)
        torch.jit.script(module).save(str(model_dir / "1" / "model.pt"))
        (model_dir / "config.pbtxt").write_text(
            f'name: "{model_dir.name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 0\n'
            'input [{ name: "INPUT__0", data_type: TYPE_INT64, dims: [-1, -1] }]\n'
            'output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [-1, -1, 16] }]\n'
            f"instance_group [{{ kind: {kind}, count: 1 }}]\n"
        )
        return model_dir

    def check(self, url: str, path: str, tensors: tuple[str, str] = ("ids", "hidden")) -> None:
        """The served model's answer over HTTP against the numpy one; ``tensors``: (input, output) names, the
        ONNX model's by default, ("INPUT__0", "OUTPUT__0") for the TorchScript one."""
        import requests

        ids = np.random.default_rng(1).integers(0, self.rows, size=(2, 7))
        body = {"inputs": [{"name": tensors[0], "shape": [2, 7], "datatype": "INT64", "data": ids.flatten().tolist()}]}
        r = requests.post(f"{url}{path}", json=body, timeout=120)
        assert r.status_code == 200, r.text[:1000]
        (out,) = [o for o in r.json()["outputs"] if o["name"] == tensors[1]]
        np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), self(ids), atol=1e-3, rtol=1e-3)
