"""Python-based stand-in for Triton's native ``onnxruntime`` backend (``platform: "onnxruntime_onnx"``).

Triton runs this file through its Python backend when ``libtriton_onnxruntime.so`` is absent from the
backend directory. It follows the native backend's conventions so a repository works unchanged in
NVIDIA's image: model file ``<version>/<default_model_filename or model.onnx>`` (a directory holding
``model.onnx`` too), config tensor names are the ONNX graph's names, config types must equal the
graph's, dims are checked the native way, ``intra_op_thread_count`` / ``inter_op_thread_count`` /
``execution_mode`` and ``optimization { graph { level } }`` are honoured, and a failing run answers
500 ``onnx runtime error <code>: <message>`` as natively, whatever the status (see ``_common``).
"""

from __future__ import annotations

from typing import Any

import onnxruntime as ort
from numpy.typing import NDArray

from smtriton.serve.triton.pybackends import _common as common

# ONNX Runtime's type strings for the config types this backend serves.
CONFIG_TO_ORT = {
    "TYPE_BOOL": "tensor(bool)",
    "TYPE_UINT8": "tensor(uint8)",
    "TYPE_UINT16": "tensor(uint16)",
    "TYPE_UINT32": "tensor(uint32)",
    "TYPE_UINT64": "tensor(uint64)",
    "TYPE_INT8": "tensor(int8)",
    "TYPE_INT16": "tensor(int16)",
    "TYPE_INT32": "tensor(int32)",
    "TYPE_INT64": "tensor(int64)",
    "TYPE_FP16": "tensor(float16)",
    "TYPE_FP32": "tensor(float)",
    "TYPE_FP64": "tensor(double)",
}
ORT_TO_CONFIG = {v: k for k, v in CONFIG_TO_ORT.items()}
ORT_TO_CONFIG.update({"tensor(string)": "TYPE_STRING", "tensor(bfloat16)": "TYPE_BF16"})

# Native meaning of optimization.graph.level: -1 basic, 1 extended, 2 none, anything else all.
GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


class TritonPythonModel:
    """One instance per Triton model instance (one stub process each)."""

    def initialize(self, args: dict[str, str]) -> None:
        spec = common.ModelSpec.from_args(args)
        common.check_data_types(spec, "onnxruntime")
        path = spec.model_path("model.onnx")
        if path.is_dir():
            path = path / "model.onnx"
        if not path.is_file():
            raise common.ModelLoadError(f"unable to load model '{spec.name}': no ONNX file at {path}")
        self.spec = spec
        options = _session_options(spec)
        try:
            self.session = ort.InferenceSession(str(path), options, providers=_providers(spec))
        except Exception as exc:  # ORT's own message says what is wrong with the file
            raise common.ModelLoadError(
                f"unable to load model '{spec.name}': ONNX Runtime cannot load {path}: {exc}"
            ) from exc
        _validate(spec, self.session)
        # Scalars in the graph are fed from the config's [1]-shaped tensors (native allows that).
        self.scalars = {i.name for i in self.session.get_inputs() if len(i.shape) == 0}

    def execute(self, requests: list[Any]) -> list[Any]:
        return common.execute(requests, self.spec, self._run)

    def _run(self, inputs: dict[str, NDArray[Any]], wanted: list[str]) -> dict[str, NDArray[Any]]:
        feed = {n: (a.reshape(()) if n in self.scalars else a) for n, a in inputs.items()}
        try:
            results = self.session.run(wanted, feed)
        except Exception as exc:
            # An ONNX Runtime status is reported in the native wording; anything else is unexpected.
            failure = common.ort_failure(exc)
            if failure is None:
                raise
            raise failure from exc
        return dict(zip(wanted, results, strict=True))


def _session_options(spec: common.ModelSpec) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    # Default: cores divided among instances (1 each on 2 cores with Triton's default 2 CPU
    # instances); measurements in default_intra_op_threads. An explicit 0 keeps the native meaning,
    # "ONNX Runtime decides" (all cores).
    intra = spec.int_param("intra_op_thread_count", default=common.default_intra_op_threads(spec))
    inter = spec.int_param("inter_op_thread_count", default=0)
    if intra > 0:
        opts.intra_op_num_threads = intra
    if inter > 0:
        opts.inter_op_num_threads = inter
    mode = spec.int_param("execution_mode", default=0)
    if mode not in (0, 1):
        raise common.ModelLoadError(
            f"model '{spec.name}': expected values for execution_mode are 0 or 1 but got {mode}"
        )
    opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL
    level = int(spec.config.get("optimization", {}).get("graph", {}).get("level", 0))
    opts.graph_optimization_level = GRAPH_LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return opts


def _providers(spec: common.ModelSpec) -> list[Any]:
    if spec.instance_kind == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"device_id": spec.device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _validate(spec: common.ModelSpec, session: ort.InferenceSession) -> None:
    """Config and graph must agree on names, types and dims; the load fails naming the mismatch."""
    required = {i.name: i for i in session.get_inputs()}
    # Initializers a request may override count as inputs too, as natively.
    graph_inputs = {**{i.name: i for i in session.get_overridable_initializers()}, **required}
    graph_outputs = {o.name: o for o in session.get_outputs()}
    configured = {t.name for t in spec.inputs}
    for name in required:
        if name not in configured:
            raise common.ModelLoadError(
                f"unable to load model '{spec.name}': the ONNX graph needs input '{name}', which the "
                f"model configuration does not list (configured inputs: {sorted(configured)})"
            )
    for kind, tensors, graph in (
        ("input", spec.inputs, graph_inputs),
        ("output", spec.outputs, graph_outputs),
    ):
        for t in tensors:
            node = graph.get(t.name)
            if node is None:
                raise common.ModelLoadError(
                    f"unable to load model '{spec.name}': unexpected inference {kind} '{t.name}', "
                    f"allowed {kind}s are: {', '.join(graph)}"
                )
            provided = ORT_TO_CONFIG.get(node.type, node.type)
            if provided != t.data_type:
                raise common.ModelLoadError(
                    f"unable to load model '{spec.name}', configuration expects datatype {t.data_type} "
                    f"for {kind} '{t.name}', model provides {provided}"
                )
            shape = [d if isinstance(d, int) else None for d in node.shape]
            if not shape and all(d == 1 for d in t.model_dims) and not spec.batching:
                continue  # scalar in the graph, [1] in the config: allowed natively
            mismatch = common.compare_dims(spec, t, shape)
            if mismatch:
                raise common.ModelLoadError(f"unable to load model '{spec.name}': {mismatch}")
