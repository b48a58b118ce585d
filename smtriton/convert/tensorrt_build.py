"""ONNX -> TensorRT plan, and running a plan: the only module that talks to TensorRT.

TensorRT 10.x and 11.x through their common name-based API (``num_io_tensors``, ``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``; the binding-index API is gone since 10). Precision the
way each version wants it: 10 takes builder flags (FP16, BF16, INT8 with a calibration-data hook)
or a strongly typed network; 11 builds only strongly typed networks, so FP16 comes from the graph —
an FP16-cast ONNX (inputs/outputs kept FP32) made here with :func:`smtriton.convert.onnx_tools.cast_fp16`.

``tensorrt`` is imported lazily (:func:`load_tensorrt`); device buffers use ``cuda-python``
(``smtriton[tensorrt]``), never pycuda. Build inside the serving image so that builder and runtime
TensorRT match (``smtriton/convert/build_tensorrt_in_image.sh``); the sidecar records what a runtime checks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from smtriton import dtypes
from smtriton.convert.tensorrt_profiles import (
    HARDWARE_LEVELS,
    PRECISIONS,
    Profile,
    RuntimeInfo,
    Sidecar,
    input_shapes,
    read_sidecar,
    sha256_file,
    write_sidecar,
)
from smtriton.errors import ToolError
from smtriton.repo.artifacts import Signature, TensorSig, onnx_signature


class TensorRTError(ToolError, RuntimeError):
    """TensorRT is missing, or refused the network, the options or the plan."""


def load_tensorrt() -> ModuleType:
    try:
        import tensorrt
    except ImportError as exc:
        raise TensorRTError(
            "the tensorrt Python package is not importable here; build plans inside the serving image "
            f"(smtriton/convert/build_tensorrt_in_image.sh), where TensorRT matches the runtime ({exc})"
        ) from None
    return tensorrt


def major_version(trt: ModuleType) -> int:
    return int(str(trt.__version__).split(".")[0])


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str


def gpu_info(device: int = 0, run: Callable[..., Any] = subprocess.run) -> GpuInfo:
    """Name and compute capability of GPU ``device`` from nvidia-smi (present wherever a GPU is)."""
    if shutil.which("nvidia-smi") is None and run is subprocess.run:
        raise TensorRTError("no nvidia-smi on this host: a TensorRT build needs an NVIDIA GPU")
    result = run(
        ["nvidia-smi", f"--id={device}", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    line = result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else ""
    name, _, capability = line.rpartition(",")
    if not name or not capability.strip():
        raise TensorRTError(f"nvidia-smi could not describe GPU {device}: {result.stderr.strip() or line!r}")
    return GpuInfo(name.strip(), capability.strip())


def runtime_info(device: int = 0) -> RuntimeInfo:
    """This host's TensorRT version and GPU, what
    :func:`smtriton.serve.triton.tensorrt_sidecar.check_compatibility` compares."""
    gpu = gpu_info(device)
    return RuntimeInfo(str(load_tensorrt().__version__), gpu.name, gpu.compute_capability)


class BuildMonitor(Protocol):
    """What the builder reports while it works (TensorRT's IProgressMonitor, as plain methods)."""

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None: ...
    def step_complete(self, phase: str, step: int) -> bool: ...  # False cancels the build
    def phase_finish(self, phase: str) -> None: ...


Batches = Callable[[], Iterable[Mapping[str, np.ndarray]]]  # calibration data: input name -> array, per batch


@dataclass
class BuildOptions:
    profiles: Sequence[Profile]  # one or more; axis name -> (min, opt, max)
    precision: str = "fp32"  # see tensorrt_profiles.PRECISIONS
    workspace_bytes: int | None = None
    timing_cache: Path | None = None  # read if present, written after the build
    calibration: Batches | None = None  # INT8 on TensorRT 10
    calibration_cache: Path | None = None
    optimization_level: int | None = None  # builder_optimization_level 0..5
    version_compatible: bool = False
    hardware_compatibility: str = "none"  # see tensorrt_profiles.HARDWARE_LEVELS
    device: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def precision_plan(major: int, precision: str) -> tuple[list[str], bool, bool]:
    """(builder flags, strongly typed network, cast the ONNX to FP16 first) for a TensorRT major version."""
    if precision not in PRECISIONS:
        raise TensorRTError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if major < 10:
        raise TensorRTError(f"TensorRT {major}.x is not supported: use 10.x or 11.x")
    if major == 10:
        flags = {"fp32": [], "fp16": ["FP16"], "bf16": ["BF16"], "int8": ["INT8"], "strongly-typed": []}[precision]
        return flags, precision == "strongly-typed", False
    # 11.x: no precision flags; the graph's types decide.
    if precision in ("fp32", "strongly-typed"):
        return [], True, False
    if precision == "fp16":
        return [], True, True
    raise TensorRTError(
        f"TensorRT {major}.x builds only strongly typed networks and has no {precision.upper()} builder flag: "
        "put the precision in the graph (Q/DQ nodes for INT8, e.g. with NVIDIA ModelOpt) and build with "
        "--precision strongly-typed"
    )


def build_plan(
    onnx_path: Path,
    plan_path: Path,
    options: BuildOptions,
    *,
    monitor: BuildMonitor | None = None,
    trt: ModuleType | None = None,
    gpu: GpuInfo | None = None,
) -> Sidecar:
    """Build ``plan_path`` (and its sidecar) from ``onnx_path``; returns the sidecar written."""
    trt = trt or load_tensorrt()
    major = major_version(trt)
    flags, strongly_typed, cast = precision_plan(major, options.precision)
    if options.hardware_compatibility not in HARDWARE_LEVELS:
        raise TensorRTError(f"hardware compatibility must be one of {', '.join(HARDWARE_LEVELS)}")
    if not options.profiles:
        raise TensorRTError("at least one optimization profile is needed")
    gpu = gpu or gpu_info(options.device)
    onnx_sig = onnx_signature(onnx_path)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network_flags = 0
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        network_flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)  # ignored (always on) by 11
    network = builder.create_network(network_flags)
    parser = trt.OnnxParser(network, logger)
    with tempfile.TemporaryDirectory(prefix="smtriton-trt-") as tmp:
        source = onnx_path
        if cast:
            import onnx

            from smtriton.convert.onnx_tools import cast_fp16, save

            source = Path(tmp) / "model.fp16.onnx"
            save(cast_fp16(onnx.load(str(onnx_path))), source)
        if not parser.parse_from_file(str(source)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TensorRTError(f"TensorRT's ONNX parser rejected {onnx_path.name}: {errors}")

    config = builder.create_builder_config()
    if options.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    for flag in flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if options.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if options.hardware_compatibility != "none":
        level = options.hardware_compatibility.upper().replace("-", "_")
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)

    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    named = {t.name: t for t in onnx_sig.inputs}
    recorded: list[dict[str, dict[str, list[int]]]] = []
    created = []
    for axes in options.profiles:
        profile = builder.create_optimization_profile()
        created.append(profile)
        shapes: dict[str, dict[str, list[int]]] = {}
        for tensor in inputs:
            dims = _named_dims(list(tensor.shape), named.get(tensor.name))
            lo, opt, hi = input_shapes(tensor.name, dims, axes)
            profile.set_shape(tensor.name, lo, opt, hi)
            shapes[tensor.name] = {"min": list(lo), "opt": list(opt), "max": list(hi)}
        config.add_optimization_profile(profile)
        recorded.append(shapes)
    if "INT8" in flags:
        if options.calibration is None:
            raise TensorRTError("INT8 on TensorRT 10 needs calibration data (or a Q/DQ graph with strongly-typed)")
        config.int8_calibrator = _calibrator(trt, options.calibration, options.calibration_cache)
        config.set_calibration_profile(created[0])  # calibration runs at the first profile's opt shapes
    progress = _progress_monitor(trt, monitor) if monitor is not None else None
    if progress is not None:
        config.progress_monitor = progress
    cache = _load_timing_cache(config, options.timing_cache)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTError("TensorRT could not build an engine from this network (see its log above)")
    _atomic_write(plan_path, memoryview(serialized))
    if options.timing_cache is not None and cache is not None:
        _atomic_write(options.timing_cache, memoryview(config.get_timing_cache().serialize()))

    out_named = {t.name: t for t in onnx_sig.outputs}
    sig_in = [_tensor_sig(trt, t, named.get(t.name)) for t in inputs]
    sig_out = [
        _tensor_sig(trt, t, out_named.get(t.name)) for t in (network.get_output(i) for i in range(network.num_outputs))
    ]
    sidecar = Sidecar(
        tensorrt_version=str(trt.__version__),
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        precision=options.precision,
        strongly_typed=strongly_typed,
        profiles=recorded,
        inputs=[t.to_dict() for t in sig_in],
        outputs=[t.to_dict() for t in sig_out],
        plan_sha256=sha256_file(plan_path),
        onnx_sha256=sha256_file(onnx_path),
        workspace_bytes=options.workspace_bytes,
        version_compatible=options.version_compatible,
        hardware_compatibility=options.hardware_compatibility,
        extra={"fp16_cast": cast, **options.extra},
    )
    write_sidecar(plan_path, sidecar)
    return sidecar


def _named_dims(dims: list[int], sig: TensorSig | None) -> list[int | str | None]:
    """TensorRT says -1 for a dynamic dimension; the ONNX graph knows its axis name."""
    named: list[int | str | None] = []
    for i, d in enumerate(dims):
        if d >= 0:
            named.append(d)
        elif sig is not None and i < len(sig.shape) and isinstance(sig.shape[i], str):
            named.append(sig.shape[i])
        else:
            named.append(None)
    return named


# TensorRT DataType member -> Triton dtype name.
TRT_DTYPES = {"FLOAT": "FP32", "HALF": "FP16", "BF16": "BF16", "INT8": "INT8", "INT32": "INT32",
              "INT64": "INT64", "BOOL": "BOOL", "UINT8": "UINT8"}  # fmt: skip


def _triton_dtype(trt: ModuleType, dtype: Any) -> str:
    for member, triton in TRT_DTYPES.items():
        if getattr(trt.DataType, member, None) == dtype:
            return triton
    raise TensorRTError(f"TensorRT type {dtype} has no Triton tensor type")


def _tensor_sig(trt: ModuleType, tensor: Any, sig: TensorSig | None) -> TensorSig:
    return TensorSig(tensor.name, _triton_dtype(trt, tensor.dtype), tuple(_named_dims(list(tensor.shape), sig)))


def _progress_monitor(trt: ModuleType, sink: BuildMonitor) -> Any:
    class Monitor(trt.IProgressMonitor):  # type: ignore[name-defined]
        """TensorRT calls these from its own threads; a failing sink must never abort the build."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            with contextlib.suppress(Exception):
                sink.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                return bool(sink.step_complete(phase_name, step))
            except Exception:  # pragma: no cover - defensive
                return True

        def phase_finish(self, phase_name: str) -> None:
            with contextlib.suppress(Exception):
                sink.phase_finish(phase_name)

    return Monitor()


def _load_timing_cache(config: Any, path: Path | None) -> Any:
    """A timing cache from ``path`` (or empty); one built elsewhere is dropped, not an error."""
    data = path.read_bytes() if path is not None and path.is_file() else b""
    cache = config.create_timing_cache(data)
    if not config.set_timing_cache(cache, False) and data:
        cache = config.create_timing_cache(b"")  # mismatched device or version: start afresh
        config.set_timing_cache(cache, False)
    return cache


def _calibrator(trt: ModuleType, batches: Batches, cache: Path | None) -> Any:
    """An entropy calibrator fed by ``batches``; device copies through cuda-python."""
    memory = CudaMemory()
    base = trt.IInt8EntropyCalibrator2

    class Calibrator(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self._batches = iter(batches())
            self._buffers: dict[str, tuple[int, int]] = {}  # name -> (pointer, bytes)

        def get_batch_size(self) -> int:
            return 1  # explicit-batch networks: the batch is part of each array's shape

        def get_batch(self, names: list[str]) -> list[int] | None:
            batch = next(self._batches, None)
            if batch is None:
                return None
            pointers = []
            for name in names:
                array = np.ascontiguousarray(batch[name])
                pointer, size = self._buffers.get(name, (0, 0))
                if size < array.nbytes:
                    if pointer:
                        memory.free(pointer)
                    pointer, size = memory.alloc(array.nbytes), array.nbytes
                    self._buffers[name] = (pointer, size)
                memory.to_device(pointer, array)
                pointers.append(pointer)
            return pointers

        def read_calibration_cache(self) -> bytes | None:
            return cache.read_bytes() if cache is not None and cache.is_file() else None

        def write_calibration_cache(self, data: Any) -> None:
            if cache is not None:
                _atomic_write(cache, memoryview(data))

    return Calibrator()


class CudaMemory:
    """Device buffers and a stream through cuda-python's runtime bindings (installs anywhere)."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            try:
                from cuda import cudart  # cuda-python < 12.6
            except ImportError:
                raise TensorRTError("device buffers need cuda-python: pip install 'smtriton[tensorrt]'") from None
        self.cudart = cudart

    def _check(self, result: Any) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise TensorRTError(f"CUDA error {err}")
        return values[0] if len(values) == 1 else values

    def alloc(self, nbytes: int) -> int:
        return int(self._check(self.cudart.cudaMalloc(max(nbytes, 1))))

    def free(self, pointer: int) -> None:
        self._check(self.cudart.cudaFree(pointer))

    def stream(self) -> int:
        return int(self._check(self.cudart.cudaStreamCreate()))

    def to_device(self, pointer: int, array: np.ndarray, stream: int = 0) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, kind, stream))

    def to_host(self, array: np.ndarray, pointer: int, stream: int = 0) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.cudart.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, kind, stream))

    def synchronize(self, stream: int) -> None:
        self._check(self.cudart.cudaStreamSynchronize(stream))


Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def engine_signature(plan_path: Path, trt: ModuleType | None = None) -> Signature:
    """I/O of the engine itself (needs TensorRT and a GPU); dynamic dims named from the sidecar."""
    trt = trt or load_tensorrt()
    engine = _deserialize(trt, plan_path)
    sidecar = read_sidecar(plan_path)
    recorded = {t["name"]: TensorSig.from_dict(t) for t in (sidecar.inputs + sidecar.outputs)} if sidecar else {}
    inputs: list[TensorSig] = []
    outputs: list[TensorSig] = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dims = _named_dims(list(engine.get_tensor_shape(name)), recorded.get(name))
        tensor = TensorSig(name, _triton_dtype(trt, engine.get_tensor_dtype(name)), tuple(dims))
        (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(tensor)
    return Signature(tuple(inputs), tuple(outputs), "TensorRT engine")


def _deserialize(trt: ModuleType, plan_path: Path) -> Any:
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    if engine is None:
        raise TensorRTError(f"TensorRT {trt.__version__} cannot load {plan_path} (built for another version or GPU?)")
    return engine


def plan_runner(plan_path: Path, *, trt: ModuleType | None = None, memory: Any = None) -> Runner:
    """Run the plan on numpy inputs: name-based I/O, the first profile whose range fits the inputs."""
    trt = trt or load_tensorrt()
    memory = memory if memory is not None else CudaMemory()
    engine = _deserialize(trt, plan_path)
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    output_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    stream = memory.stream()
    current = [0]

    def pick_profile(feeds: Mapping[str, np.ndarray]) -> int:
        for index in range(engine.num_optimization_profiles):
            fits = True
            for name in input_names:
                lo, _, hi = engine.get_tensor_profile_shape(name, index)
                shape = feeds[name].shape
                fits &= len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True))
            if fits:
                return index
        shapes = {n: list(feeds[n].shape) for n in input_names}
        raise TensorRTError(f"input shapes {shapes} fit none of the plan's optimization profiles")

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        profile = pick_profile(feeds)
        if profile != current[0]:
            context.set_optimization_profile_async(profile, stream)
            current[0] = profile
        pointers: list[int] = []
        results: dict[str, tuple[np.ndarray, int]] = {}
        try:
            for name in input_names:
                array = np.ascontiguousarray(feeds[name], dtype=trt.nptype(engine.get_tensor_dtype(name)))
                if not context.set_input_shape(name, array.shape):
                    raise TensorRTError(f"input {name!r}: shape {list(array.shape)} rejected by the plan")
                pointer = memory.alloc(array.nbytes)
                pointers.append(pointer)
                memory.to_device(pointer, array, stream)
                context.set_tensor_address(name, pointer)
            for name in output_names:
                shape = tuple(context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise TensorRTError(f"output {name!r} has a data-dependent shape {list(shape)}: not supported")
                array = np.empty(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))
                pointer = memory.alloc(array.nbytes)
                pointers.append(pointer)
                context.set_tensor_address(name, pointer)
                results[name] = (array, pointer)
            if not context.execute_async_v3(stream):
                raise TensorRTError("execute_async_v3 failed")
            for array, pointer in results.values():
                memory.to_host(array, pointer, stream)
            memory.synchronize(stream)
        finally:
            for pointer in pointers:
                memory.free(pointer)
        return {name: array for name, (array, _) in results.items()}

    return run


def verification_cases(
    sidecar: Sidecar, ranges: Mapping[str, tuple[int, int]], trials: int = 2, seed: int = 0
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Random inputs at every profile's min, opt and max shapes; integer inputs drawn from ``ranges``
    (an integer input with none: [0, 2), a mask's values)."""
    from smtriton.convert.recipe import TensorSpec
    from smtriton.convert.sample_inputs import random_inputs

    dtypes_by_name = {t["name"]: t["dtype"] for t in sidecar.inputs}
    cases = []
    for p, profile in enumerate(sidecar.profiles):
        for which in ("min", "opt", "max"):
            specs = [
                TensorSpec(name, dtypes_by_name[name], tuple(shapes[which]), ranges.get(name, (0, 2)))
                if dtypes_by_name[name] in dtypes.INTEGER
                else TensorSpec(name, dtypes_by_name[name], tuple(shapes[which]))
                for name, shapes in profile.items()
            ]
            for trial in range(trials):
                cases.append((f"profile {p} {which} trial {trial}", random_inputs(specs, {}, (seed, p, trial))))
    return cases


def verify_plan(
    plan_path: Path,
    reference_onnx: Path,
    *,
    ranges: Mapping[str, tuple[int, int]] | None = None,
    atol: float,
    rtol: float,
    trials: int = 2,
    runner: Runner | None = None,
) -> Any:
    """The plan against ONNX Runtime running the FP32 reference graph, at every profile's extremes.

    Integer inputs take their values from ``ranges``, else from the table they index in the graph (token
    ids: the vocabulary). Returns a :class:`smtriton.convert.parity.ParityReport`; an FP16-cast or INT8
    plan is compared with the same FP32 reference as an FP32 one, so the reported errors are the whole
    cost of the precision.
    """
    import onnxruntime as ort

    from smtriton.convert.parity import compare
    from smtriton.repo.artifacts import onnx_index_ranges

    sidecar = read_sidecar(plan_path)
    if sidecar is None:
        raise TensorRTError(f"{plan_path}: no sidecar, cannot tell the profiles to test")
    session = ort.InferenceSession(str(reference_onnx), providers=["CPUExecutionProvider"])
    out_names = [t["name"] for t in sidecar.outputs]

    def reference(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(out_names, session.run(out_names, dict(feeds)), strict=True))

    candidate = runner or plan_runner(plan_path)
    values = {**onnx_index_ranges(reference_onnx), **(ranges or {})}
    return compare(reference, candidate, verification_cases(sidecar, values, trials), atol=atol, rtol=rtol)


def build_checked_plan(
    onnx_path: Path,
    plan_path: Path,
    options: BuildOptions,
    *,
    max_batch_size: int,
    verify: bool = True,
    reference: Path | None = None,
    ranges: Mapping[str, tuple[int, int]] | None = None,
    atol: float,
    rtol: float,
    trials: int = 2,
    monitor: BuildMonitor | None = None,
) -> tuple[Sidecar, Any]:
    """What `smtriton convert tensorrt` and a recipe's tensorrt entry both do: build the plan and its
    sidecar, record the max_batch_size it is served with (so `smtriton config` batches it the same
    way), and check it against ONNX Runtime on ``reference`` (default: the source graph).

    Returns (sidecar, :class:`smtriton.convert.parity.ParityReport` or None without ``verify``)."""
    sidecar = build_plan(onnx_path, plan_path, options, monitor=monitor)
    sidecar.max_batch_size = max_batch_size
    write_sidecar(plan_path, sidecar)
    if not verify:
        return sidecar, None
    report = verify_plan(plan_path, reference or onnx_path, ranges=ranges, atol=atol, rtol=rtol, trials=trials)
    return sidecar, report


def plan_config(name: str, plan_path: Path, options: Any) -> Any:
    """The config of a plan: its I/O read from the engine itself, the rest from ``options``
    (:class:`smtriton.convert.config.ConfigOptions`)."""
    from smtriton.convert.config import signature_config

    return signature_config(name, ("platform", "tensorrt_plan"), engine_signature(plan_path), options)


def _atomic_write(path: Path, data: memoryview) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
    os.replace(tmp, path)
