"""Shared code of the Python-based Triton backends (``onnxruntime/``, ``pytorch/``, ``tensorrt/``).

A Triton build without a native backend runs ``<backend-dir>/<backend>/model.py`` through its Python
backend instead. These helpers keep the stand-ins behaving like the native backends, so that one model
repository works unchanged here and in NVIDIA's image: the model config is parsed once, data types
follow the native tables, requests that the dynamic batcher hands over together are concatenated into
one model call and split back, only requested outputs are produced, and every failure becomes an error
response for the request it concerns instead of a crashed stub, worded as the native backend words it
but without file paths, which go to the log.

Nothing here imports ``triton_python_backend_utils`` at module level: it exists only inside the Python
backend stub, and the pure parts must stay importable by unit tests.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from smtriton import dtypes

# Config data types the Python-based backends accept, with their numpy dtype. Absent on purpose:
# TYPE_STRING (needs a separate object-array path no stand-in implements) and TYPE_BF16 (numpy has no
# bfloat16 of its own). Both are refused at load time with a message saying so.
CONFIG_TO_NUMPY: dict[str, np.dtype[Any]] = {
    dtypes.config_type(name): dtypes.numpy_dtype(name) for name in dtypes.TRITON_DTYPES if name not in ("BYTES", "BF16")
}

NUMPY_TO_CONFIG: dict[np.dtype[Any], str] = {v: k for k, v in CONFIG_TO_NUMPY.items()}

TRUE_STRINGS = frozenset({"true", "1", "yes", "on"})
FALSE_STRINGS = frozenset({"false", "0", "no", "off"})


class ModelLoadError(Exception):
    """Raised from ``initialize``: Triton fails the load and reports this message to the caller."""


class RequestError(Exception):
    """A failure that concerns one request (or one batch) only; it becomes that request's error."""


class ExecuteError(Exception):
    """The framework failed while running the model on a request's data.

    ``str(self)`` is the answer to the client, already in the native backend's wording and free of
    file paths; ``detail`` is the framework's full text (tracebacks included) for the stub's log.
    """

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


@dataclass(frozen=True)
class TensorSpec:
    """One ``input``/``output`` entry of the model config."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False

    @property
    def dtype(self) -> np.dtype[Any]:
        return CONFIG_TO_NUMPY[self.data_type]

    @property
    def model_dims(self) -> tuple[int, ...]:
        """Shape the model itself sees without the batch dimension (``reshape`` wins over ``dims``)."""
        return self.reshape if self.reshape is not None else self.dims

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> TensorSpec:
        reshape = entry.get("reshape")
        return cls(
            name=str(entry["name"]),
            data_type=str(entry.get("data_type", "TYPE_INVALID")),
            dims=tuple(int(d) for d in entry.get("dims", ())),
            reshape=tuple(int(d) for d in reshape.get("shape", ())) if reshape else None,
            optional=bool(entry.get("optional", False)),
        )


@dataclass(frozen=True)
class ModelSpec:
    """What a backend needs from Triton's ``initialize`` args, parsed and typed once."""

    name: str
    version: str
    directory: Path
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: dict[str, str] = field(default_factory=dict)
    default_model_filename: str = ""
    instance_kind: str = "CPU"
    device_id: int = 0
    instance_count: int = 1
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> ModelSpec:
        config: dict[str, Any] = json.loads(args["model_config"])
        params = {str(k): str(v.get("string_value", "")) for k, v in (config.get("parameters") or {}).items()}
        kind = str(args.get("model_instance_kind", "CPU"))
        # Instances of this kind share the host's cores; each one is its own stub process.
        count = sum(
            int(g.get("count", 1))
            for g in config.get("instance_group", [])
            if str(g.get("kind", "KIND_CPU")).removeprefix("KIND_") == kind
        )
        return cls(
            name=str(args.get("model_name") or config.get("name", "")),
            version=str(args["model_version"]),
            directory=Path(args["model_repository"]),
            max_batch_size=int(config.get("max_batch_size", 0)),
            inputs=tuple(TensorSpec.from_config(e) for e in config.get("input", [])),
            outputs=tuple(TensorSpec.from_config(e) for e in config.get("output", [])),
            parameters=params,
            default_model_filename=str(config.get("default_model_filename") or ""),
            instance_kind=kind,
            device_id=int(args.get("model_instance_device_id", 0) or 0),
            instance_count=max(1, count),
            config=config,
        )

    def model_path(self, fallback: str) -> Path:
        """``<model dir>/<version>/<default_model_filename or fallback>``, as the native backends do."""
        return self.directory / self.version / (self.default_model_filename or fallback)

    def int_param(self, *keys: str, default: int) -> int:
        """First of ``keys`` present in ``parameters`` as an integer; ``default`` when none is set."""
        for key in keys:
            if key in self.parameters:
                raw = self.parameters[key].strip()
                try:
                    return int(raw)
                except ValueError:
                    raise ModelLoadError(
                        f"model '{self.name}': parameter '{key}' must be an integer, got '{raw}'"
                    ) from None
        return default

    def bool_param(self, key: str, default: bool) -> bool:
        """``parameters[key]`` as a boolean (true/false/1/0/yes/no/on/off); ``default`` when unset."""
        if key not in self.parameters:
            return default
        raw = self.parameters[key].strip().lower()
        if raw in TRUE_STRINGS:
            return True
        if raw in FALSE_STRINGS:
            return False
        raise ModelLoadError(f"model '{self.name}': parameter '{key}' must be true or false, got '{raw}'")

    def full_shape(self, spec: TensorSpec) -> tuple[int, ...]:
        """Shape the model sees, with a leading ``-1`` batch dimension when the config batches."""
        return (-1, *spec.model_dims) if self.batching else spec.model_dims


def check_data_types(spec: ModelSpec, backend: str, allowed: Collection[str] = frozenset(CONFIG_TO_NUMPY)) -> None:
    """Refuse config data types this stand-in cannot serve, naming the tensor and the type."""
    for kind, tensors in (("input", spec.inputs), ("output", spec.outputs)):
        for t in tensors:
            if t.data_type in allowed:
                continue
            why = {
                "TYPE_STRING": "string tensors are not supported by",
                "TYPE_BF16": "bfloat16 is not supported by",
            }.get(t.data_type, "unsupported datatype for")
            raise ModelLoadError(
                f"unable to load model '{spec.name}': {kind} '{t.name}' has {t.data_type}; {why} "
                f"the Python-based {backend} backend this host uses in place of Triton's native one"
            )


def cpu_count() -> int:
    """Cores this process may run on (affinity-aware, unlike ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def default_intra_op_threads(spec: ModelSpec) -> int:
    """Cores but one, divided among the model's instances (at least 1).

    Each instance is its own stub process; ONNX Runtime's and torch's own default (all cores per
    session) oversubscribes the CPU as soon as Triton's default two CPU instances run at once.
    Measured on 2 cores, 2 instances, client on the same box, a 4-conv CNN on 1x3x224x224:
    ORT intra_op 1 vs 2: c=8 370-530 vs 205-375 req/s, c=1 p50 3.1-3.9 vs 2.3-7.9 ms; an MLP
    1200-1500 vs 1030-1140 req/s at c=8. torch 1 vs 2 threads: c=8 225-330 vs 30-410 req/s, with
    2 threads repeatedly collapsing (p50 150-260 ms) as the two processes' OpenMP pools fought for
    the cores. One thread per instance costs some c=1 latency on big models when the other instance
    is idle, but never collapses; set the native thread parameters to trade differently.
    """
    # One core is left to the front server and Triton's own threads, which serve every request:
    # bench/NOTES.md measured ORT at 1 intra-op thread vs 2 on 2 cores (1 instance, text encoder,
    # c=16): +50 % throughput behind serve, Triton's CPU per request 0.37 vs 0.84 ms.
    return max(1, (cpu_count() - 1) // spec.instance_count)


def compare_dims(spec: ModelSpec, tensor: TensorSpec, model_shape: Sequence[int | None]) -> str | None:
    """Native rule (onnxruntime backend's ``CompareDimsSupported``): same rank, and every fixed model
    dimension equals the config's; with batching the model's first dimension must be dynamic.
    ``None``/negative model dimensions are dynamic. Returns the mismatch message or ``None``."""
    model = tuple(-1 if d is None or d < 0 else int(d) for d in model_shape)
    want = spec.full_shape(tensor)
    if spec.batching and (not model or model[0] != -1):
        return (
            f"tensor '{tensor.name}': for the model to support batching the shape "
            f"should have at least 1 dimension and the first dimension must be dynamic; but shape expected "
            f"by the model is {list(model)}"
        )
    if len(model) != len(want) or any(m not in (-1, w) for m, w in zip(model, want, strict=True)):
        extra = " (a batch dimension first because max_batch_size > 0)" if spec.batching else ""
        return (
            f"tensor '{tensor.name}': the model expects {len(model)} dimensions "
            f"(shape {list(model)}) but the model configuration specifies {len(want)} dimensions "
            f"(shape {list(want)}){extra}"
        )
    return None


# --------------------------------------------------------------------------------------------------
# Failures: what a client is told, what the log gets.
#
# Status codes follow the native backends: every error raised while running the model is
# TRITONSERVER_ERROR_INTERNAL, which Triton answers with 500 (docs/contract.md §2.6: "any error raised
# by the model"). The onnxruntime backend does so for every ONNX Runtime status, INVALID_ARGUMENT
# included ("onnx runtime error <code>: <message>"; serve's front answers ONNX Runtime's refusals of
# the request's data as 400, as for NVIDIA's backend); the pytorch backend as "PyTorch execute failure:
# <what>". The wording is kept, but file paths never reach the client: a TorchScript error carries
# the exporting machine's source paths in its traceback, and ONNX Runtime's checks name its build
# tree. The full text goes to the stub's log instead.

# An absolute file path (POSIX, or Windows for models exported there): directories, then a name with
# an extension. Requiring the extension keeps ONNX node names such as '/embed/Gather' intact.
_ABSOLUTE_FILE = re.compile(
    r"""(?<![\w./\\-])(?:/(?:[^\s/:"'(),<>]+/)+|[A-Za-z]:\\(?:[^\s\\:"'(),<>]+\\)+)"""
    r"""(?P<name>[^\s/\\:"'(),<>]*\.[A-Za-z][\w]*)"""
)
# ONNX Runtime's Python binding prefixes the status it raises with its code and the code's name.
_ORT_STATUS = re.compile(r"\A\s*\[ONNXRuntimeError\] : (?P<code>\d+) : \w+ : ")
# A TorchScript error: a header, one traceback per code view (serialized, original), then the error.
_TORCHSCRIPT_TRACEBACK = "Traceback of TorchScript"
# The line that starts the error itself: a (dotted) exception name, a colon, the message.
_EXCEPTION_LINE = re.compile(r"\A[A-Za-z_][\w.]*: ")
# A frame of a traced model's original-code traceback: "<file>(<line>): <function>".
_TRACED_FRAME = re.compile(r"\A\S.*\(\d+\): \S+\Z")
# c10's C++ backtrace, shown when TORCH_SHOW_CPP_STACKTRACES is set: a header line ("C++
# CapturedTraceback:" now, "Exception raised from ... (most recent call first):" in older torch),
# then one line per frame ("#4 ..." now, "frame #4: ..." before).
_CPP_BACKTRACE = re.compile(
    r"\A(?:C\+\+ CapturedTraceback:|Exception raised from .*\(most recent call first\):|#\d+ |frame #\d+: )"
)


def scrub_paths(text: str) -> str:
    """``text`` with every absolute file path reduced to the file's name: ``/src/ops/broadcast.h:563``
    becomes ``broadcast.h:563``, still useful, while the machine's directories stay on the host."""
    return _ABSOLUTE_FILE.sub(lambda m: m.group("name"), text)


def ort_error_message(text: str) -> str | None:
    """The native onnxruntime backend's message for an ONNX Runtime status raised by ``session.run``:
    ``onnx runtime error <code>: <message>``, paths scrubbed. ``None`` when ``text`` is not a status."""
    match = _ORT_STATUS.match(text)
    if match is None:
        return None
    return f"onnx runtime error {match['code']}: {scrub_paths(text[match.end() :].strip())}"


def torch_error_summary(text: str) -> str:
    """What a TorchScript forward failed with, without its tracebacks, C++ frames or file paths.

    The interpreter's text is a header, a traceback of the serialized code (``code/__torch__/...``
    frames), one of the original code (the exporting machine's files), then the error itself, e.g.
    ``RuntimeError: index out of range in self``. The error starts at the first line after the last
    traceback header that reads ``<ExceptionName>: ``; code lines in the frames are indented or
    carry a space before any colon. Text without a traceback is kept whole.
    """
    lines = [line for line in text.splitlines() if not _CPP_BACKTRACE.match(line)]
    headers = [i for i, line in enumerate(lines) if line.startswith(_TORCHSCRIPT_TRACEBACK)]
    if headers:
        rest = lines[headers[-1] + 1 :]
        start = next((i for i, line in enumerate(rest) if _EXCEPTION_LINE.match(line)), None)
        if start is None:  # no recognisable error line: the last line that is not a frame
            tail = [line for line in rest if line.strip() and not line[0].isspace() and not _TRACED_FRAME.match(line)]
            rest, start = tail[-1:], 0
        lines = rest[start:]
    summary = "\n".join(lines).strip()
    return scrub_paths(summary) or "unknown error"


def ort_failure(exc: BaseException) -> ExecuteError | None:
    """``exc`` from ``InferenceSession.run`` as the native backend reports it; ``None`` if it is not
    an ONNX Runtime status (then it is an unexpected failure, see ``describe_failure``)."""
    message = ort_error_message(str(exc))
    return None if message is None else ExecuteError(message, detail=str(exc))


def torch_failure(exc: BaseException) -> ExecuteError:
    """An exception from a TorchScript ``forward`` as the native pytorch backend reports it."""
    text = str(exc) or type(exc).__name__
    return ExecuteError(f"PyTorch execute failure: {torch_error_summary(text)}", detail=text)


def describe_failure(spec: ModelSpec, exc: BaseException) -> tuple[str, str | None]:
    """(answer to the client, text for the log or ``None``) for a request that failed with ``exc``.

    Our own ``RequestError`` messages go out as they are (they hold no paths, and nothing more is
    known); a framework failure as the backend worded it; anything else is unexpected: a short
    message naming the model, and the traceback for the log.
    """
    if isinstance(exc, RequestError):
        return str(exc), None
    if isinstance(exc, ExecuteError):
        return str(exc), exc.detail
    text = str(exc) or type(exc).__name__
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return f"model '{spec.name}' failed: {scrub_paths(text)}", detail


# --------------------------------------------------------------------------------------------------
# Execution: gather, batch, run, split, respond.

# A backend's model call: full-batch inputs by config name, and the output names wanted (config
# order) -> arrays by name.
RunFn = Callable[[dict[str, NDArray[Any]], list[str]], Mapping[str, NDArray[Any]]]


@dataclass
class _Pending:
    index: int
    inputs: dict[str, NDArray[Any]]
    wanted: list[str]
    batch: int


def group_key(inputs: Mapping[str, NDArray[Any]], batching: bool) -> tuple[Any, ...]:
    """Requests with equal keys can share one model call: same inputs present with the same non-batch
    shapes (dtypes are fixed by the config, which Triton already enforced)."""
    skip = 1 if batching else 0
    return tuple((name, arr.shape[skip:]) for name, arr in sorted(inputs.items()))


def concat_inputs(parts: Sequence[Mapping[str, NDArray[Any]]]) -> dict[str, NDArray[Any]]:
    """Concatenate along the batch dimension; a single request is passed through without a copy."""
    if len(parts) == 1:
        return dict(parts[0])
    return {name: np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


def split_outputs(outputs: Mapping[str, NDArray[Any]], batches: Sequence[int]) -> list[dict[str, NDArray[Any]]]:
    """Split full-batch outputs back into per-request pieces of ``batches`` rows each."""
    if len(batches) == 1:
        return [dict(outputs)]
    total = sum(batches)
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != total:
            raise RequestError(
                f"output '{name}' has shape {list(arr.shape)}, its first dimension should be the batch size {total}"
            )
    offsets = np.cumsum([0, *batches])
    return [{name: arr[offsets[i] : offsets[i + 1]] for name, arr in outputs.items()} for i in range(len(batches))]


def shape_output(spec: ModelSpec, tensor: TensorSpec, arr: NDArray[Any]) -> NDArray[Any]:
    """Check the dtype against the config (native error text) and undo an output ``reshape``."""
    if arr.dtype != tensor.dtype:
        got = NUMPY_TO_CONFIG.get(arr.dtype, str(arr.dtype))
        raise RequestError(
            f"configuration expects datatype {tensor.data_type} for output '{tensor.name}', model provides {got}"
        )
    if tensor.reshape is not None:
        lead = (arr.shape[0],) if spec.batching else ()
        arr = arr.reshape(*lead, *tensor.dims)
    return np.ascontiguousarray(arr)


def _pb() -> Any:
    import triton_python_backend_utils as pb_utils  # only exists inside Triton's Python backend stub

    return pb_utils


def _error(message: str) -> Any:
    """An error response; ``TritonError``'s default code is INTERNAL, Triton's HTTP answer 500."""
    pb = _pb()
    return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message))


def _log_error(pb: Any, text: str) -> None:
    """Into Triton's log through the stub's logger; stderr where the stub has none."""
    logger = getattr(pb, "Logger", None)
    if logger is not None:
        logger.log_error(text)
    else:
        print(text, file=sys.stderr, flush=True)


def _failed(pb: Any, spec: ModelSpec, exc: BaseException) -> Any:
    """The error response for a request that failed with ``exc``; the full story goes to the log."""
    message, detail = describe_failure(spec, exc)
    if detail is not None:
        _log_error(pb, f"model '{spec.name}', version {spec.version}: request failed: {detail}")
    return _error(message)


def execute(requests: Sequence[Any], spec: ModelSpec, run: RunFn) -> list[Any]:
    """Answer ``requests`` in order. With ``max_batch_size > 0`` requests with matching non-batch
    shapes are run as one call, as the native backends do with dynamic batching. If a batch fails,
    its requests are retried one by one so a bad request does not take its neighbours down."""
    pb = _pb()
    responses: list[Any] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[_Pending]] = {}
    for i, request in enumerate(requests):
        try:
            pending = _read_request(pb, request, i, spec)
        except Exception as exc:
            responses[i] = _failed(pb, spec, exc)
            continue
        key = group_key(pending.inputs, spec.batching) if spec.batching else (i,)
        groups.setdefault(key, []).append(pending)

    for members in groups.values():
        try:
            _run_group(pb, members, spec, run, responses)
        except Exception as exc:
            if len(members) > 1:
                for one in members:
                    try:
                        _run_group(pb, [one], spec, run, responses)
                    except Exception as exc_one:
                        responses[one.index] = _failed(pb, spec, exc_one)
            else:
                responses[members[0].index] = _failed(pb, spec, exc)
    return responses


def _read_request(pb: Any, request: Any, index: int, spec: ModelSpec) -> _Pending:
    inputs: dict[str, NDArray[Any]] = {}
    for t in spec.inputs:
        tensor = pb.get_input_tensor_by_name(request, t.name)
        if tensor is None:
            if t.optional:
                continue
            raise RequestError(f"model '{spec.name}': missing input '{t.name}'")
        inputs[t.name] = tensor.as_numpy()
    requested = set(request.requested_output_names())
    wanted = [t.name for t in spec.outputs if t.name in requested]
    batch = 1
    if spec.batching and inputs:
        batch = int(next(iter(inputs.values())).shape[0])
    return _Pending(index=index, inputs=inputs, wanted=wanted, batch=batch)


def _run_group(pb: Any, members: list[_Pending], spec: ModelSpec, run: RunFn, responses: list[Any]) -> None:
    union = {name for m in members for name in m.wanted}
    wanted = [t.name for t in spec.outputs if t.name in union]
    outputs = run(concat_inputs([m.inputs for m in members]), wanted) if wanted else {}
    pieces = split_outputs({n: outputs[n] for n in wanted}, [m.batch for m in members])
    by_name = {t.name: t for t in spec.outputs}
    built = [
        [pb.Tensor(n, shape_output(spec, by_name[n], piece[n])) for n in m.wanted]
        for m, piece in zip(members, pieces, strict=True)
    ]
    for m, tensors in zip(members, built, strict=True):
        responses[m.index] = pb.InferenceResponse(output_tensors=tensors)
