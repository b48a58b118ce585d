"""Python-based stand-in for Triton's native ``pytorch`` backend (``platform: "pytorch_libtorch"``).

Triton runs this file through its Python backend when ``libtriton_pytorch.so`` is absent. It loads the
TorchScript file ``<version>/<default_model_filename or model.pt>`` with ``torch.jit.load`` and keeps
the native naming rules so one repository serves unchanged in NVIDIA's image:

- inputs: if every config input name is a ``forward()`` argument name, they bind by name; else if all
  are ``<name>__<index>``, they bind by index; else by config order. A ``forward`` taking a single
  ``Dict[str, Tensor]`` gets a dict keyed by config name.
- outputs: ``<name>__<index>`` picks that element of the returned tuple/list when all outputs follow
  the pattern, else config order; a single returned tensor is element 0.
- parameters ``INFERENCE_MODE`` (default on), ``DISABLE_OPTIMIZED_EXECUTION``, ``ENABLE_JIT_EXECUTOR``,
  ``ENABLE_JIT_PROFILING``, ``ENABLE_TENSOR_FUSER``, ``INTRA_OP_THREAD_COUNT``/``NUM_THREADS`` and
  ``INTER_OP_THREAD_COUNT``/``NUM_INTEROP_THREADS``.
- a failing ``forward`` answers 500 ``PyTorch execute failure: <error>``; the TorchScript traceback,
  which names the exporting machine's files, goes to the log only (see ``_common``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from numpy.typing import NDArray

from smtriton.serve.triton.pybackends import _common as common

# Inputs arrive as read-only views of Triton's shared memory; torch only warns that it cannot mark
# them read-only. Copying every input just to silence that would cost time on the hot path.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

# The native backend's table: no unsigned types wider than 8 bits, no strings here, no BF16.
TORCH_TYPES = frozenset(common.CONFIG_TO_NUMPY) - {"TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64"}

JIT_FLAGS = {  # native parameter -> torch setter; applied only when the parameter is set
    "ENABLE_JIT_EXECUTOR": torch._C._jit_set_profiling_executor,
    "ENABLE_JIT_PROFILING": torch._C._jit_set_profiling_mode,
    "ENABLE_TENSOR_FUSER": torch._C._jit_set_texpr_fuser_enabled,
}


class TritonPythonModel:
    """One instance per Triton model instance (one stub process each, so torch globals are ours)."""

    def initialize(self, args: dict[str, str]) -> None:
        spec = common.ModelSpec.from_args(args)
        common.check_data_types(spec, "pytorch", allowed=TORCH_TYPES)
        _configure_torch(spec)
        self.spec = spec
        self.inference_mode = spec.bool_param("INFERENCE_MODE", default=True)
        self.device = torch.device("cpu")
        if spec.instance_kind == "GPU" and torch.cuda.is_available():
            self.device = torch.device("cuda", spec.device_id)
        path = spec.model_path("model.pt")
        if not path.is_file():
            raise common.ModelLoadError(f"unable to load model '{spec.name}': no TorchScript file at {path}")
        try:
            self.module = torch.jit.load(str(path), map_location=self.device).eval()  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise common.ModelLoadError(
                f"unable to load model '{spec.name}': torch.jit.load cannot read {path} (a TorchScript "
                f"file from torch.jit.script/trace + save is needed): {exc}"
            ) from exc
        self.dict_input, self.in_index = _input_binding(spec, self.module)
        self.out_index = _output_binding(spec)

    def execute(self, requests: list[Any]) -> list[Any]:
        return common.execute(requests, self.spec, self._run)

    def _run(self, inputs: dict[str, NDArray[Any]], wanted: list[str]) -> dict[str, NDArray[Any]]:
        tensors = {n: torch.from_numpy(a).to(self.device) for n, a in inputs.items()}
        args: list[Any]
        if self.dict_input:
            args = [tensors]
        else:
            args = [None] * len(self.in_index)
            for name, index in self.in_index.items():
                args[index] = tensors.get(name)
        guard = torch.inference_mode() if self.inference_mode else torch.no_grad()
        with guard:
            try:
                result = self.module(*args)
            except Exception as exc:  # native: "PyTorch execute failure: ...", without the traceback
                raise common.torch_failure(exc) from exc
        elements = _elements(result)
        out: dict[str, NDArray[Any]] = {}
        for name in wanted:
            index = self.out_index[name]
            if index >= len(elements):
                raise common.RequestError(
                    f"output '{name}' wants element {index} of the model's result, which has {len(elements)} element(s)"
                )
            out[name] = elements[index].detach().cpu().numpy()
        return out


def _configure_torch(spec: common.ModelSpec) -> None:
    """Process-wide torch settings; safe because each model instance is its own stub process."""
    # Default threads: cores divided among instances (1 each on 2 cores with Triton's default 2 CPU
    # instances); torch's own default, all cores per process, collapsed under load in measurements
    # (see default_intra_op_threads). An explicit 0 keeps torch's default.
    intra = spec.int_param("INTRA_OP_THREAD_COUNT", "NUM_THREADS", default=common.default_intra_op_threads(spec))
    inter = spec.int_param("INTER_OP_THREAD_COUNT", "NUM_INTEROP_THREADS", default=0)
    if intra > 0:
        torch.set_num_threads(intra)
    if inter > 0:
        with contextlib.suppress(RuntimeError):  # raises if already set; first value wins, as natively
            torch.set_num_interop_threads(inter)
    disable = spec.bool_param("DISABLE_OPTIMIZED_EXECUTION", default=False)
    torch._C._set_graph_executor_optimize(not disable)
    for key, setter in JIT_FLAGS.items():
        if key in spec.parameters:
            setter(spec.bool_param(key, default=True))


def _index_suffix(name: str) -> int | None:
    """``INPUT__3`` -> 3 (text after the first ``__``, all digits, as natively); else ``None``."""
    _, sep, tail = name.partition("__")
    return int(tail) if sep and tail.isdigit() else None


def _input_binding(spec: common.ModelSpec, module: Any) -> tuple[bool, dict[str, int]]:
    """(forward takes one Dict[str, Tensor], config input name -> positional index)."""
    arguments = list(module.forward.schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]
    if len(arguments) == 1 and arguments[0].type.kind() == "DictType":
        return True, {t.name: i for i, t in enumerate(spec.inputs)}
    arg_names = [a.name for a in arguments]
    if len(arg_names) != len(spec.inputs):
        raise common.ModelLoadError(
            f"unable to load model '{spec.name}', configuration expects {len(spec.inputs)} inputs, "
            f"model provides {len(arg_names)} (forward({', '.join(arg_names)}))"
        )
    names = [t.name for t in spec.inputs]
    indexed = [_index_suffix(n) for n in names]
    if all(n in arg_names for n in names):
        binding = {n: arg_names.index(n) for n in names}
    elif all(i is not None for i in indexed):
        binding = {n: i for n, i in zip(names, indexed, strict=True) if i is not None}
    else:
        binding = {n: i for i, n in enumerate(names)}
    _check_indices(spec, "input", binding, len(arg_names))
    return False, binding


def _output_binding(spec: common.ModelSpec) -> dict[str, int]:
    names = [t.name for t in spec.outputs]
    indexed = [_index_suffix(n) for n in names]
    if names and all(i is not None for i in indexed):
        binding = {n: i for n, i in zip(names, indexed, strict=True) if i is not None}
    else:
        binding = {n: i for i, n in enumerate(names)}
    _check_indices(spec, "output", binding, None)
    return binding


def _check_indices(spec: common.ModelSpec, kind: str, binding: dict[str, int], limit: int | None) -> None:
    seen: dict[int, str] = {}
    for name, index in binding.items():
        if limit is not None and index >= limit:
            raise common.ModelLoadError(
                f"unable to load model '{spec.name}': {kind} '{name}' names index {index} but forward() "
                f"takes {limit} tensor argument(s)"
            )
        if index in seen:
            raise common.ModelLoadError(
                f"unable to load model '{spec.name}': {kind}s '{seen[index]}' and '{name}' both name index {index}"
            )
        seen[index] = name


def _elements(result: Any) -> Sequence[torch.Tensor]:
    """The model's result as a sequence of tensors: a tensor is element 0, a tuple/list is itself."""
    items = [result] if isinstance(result, torch.Tensor) else result
    if not isinstance(items, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in items):
        raise common.RequestError(
            f"the model returned {type(result).__name__}; expected a Tensor or a tuple/list of Tensors"
        )
    return items
