"""The TensorRT toolchain on CPU, against a stand-in of the TensorRT 10/11 Python API.

The stand-in (``FakeTensorRT``) implements exactly the surface ``smtriton.convert.tensorrt_build`` calls, with the
rules the real library enforces where they matter: name-based I/O, profile shapes checked
(min <= opt <= max, ranks, known inputs), precision flags that exist only on 10.x, a plan that only
deserializes on the TensorRT version that built it, and progress-monitor callbacks. Its "engine"
runs the parsed ONNX graph with ONNX Runtime, and device memory is a dict of byte buffers, so the
build -> verify -> config -> validate path runs end to end here. Real builds: tests/gpu/.
"""

from __future__ import annotations

import json
import sys
import types
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from smtriton.cli import app
from smtriton.convert import tensorrt_build
from smtriton.convert.tensorrt_profiles import (
    AxisRange,
    ProfileError,
    RuntimeInfo,
    Sidecar,
    SidecarError,
    check_compatibility,
    input_shapes,
    parse_profile,
    profile_text,
    read_sidecar,
    recipe_profile,
    sidecar_path,
)
from smtriton.repo.artifacts import SignatureError
from smtriton.repo.validate import errors, validate_repository

# --- the stand-in -------------------------------------------------------------------------------------

ONNX_TO_TRT = {TensorProto.FLOAT: "FLOAT", TensorProto.FLOAT16: "HALF", TensorProto.INT64: "INT64",
               TensorProto.INT32: "INT32", TensorProto.BOOL: "BOOL", TensorProto.INT8: "INT8"}  # fmt: skip
NUMPY = {"FLOAT": np.float32, "HALF": np.float16, "INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_,
         "INT8": np.int8, "UINT8": np.uint8}  # fmt: skip


def make_fake_tensorrt(version: str) -> types.ModuleType:
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.DataType = IntEnum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "INT64", "BF16"])
    trt.TensorIOMode = IntEnum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    trt.MemoryPoolType = IntEnum("MemoryPoolType", ["WORKSPACE"])
    trt.NetworkDefinitionCreationFlag = IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 1})
    flags = ["DEBUG", "VERSION_COMPATIBLE", "REFIT"] + (["FP16", "BF16", "INT8"] if major == 10 else [])
    trt.BuilderFlag = IntEnum("BuilderFlag", flags)
    trt.HardwareCompatibilityLevel = IntEnum(
        "HardwareCompatibilityLevel", ["NONE", "AMPERE_PLUS", "SAME_COMPUTE_CAPABILITY"]
    )
    trt.built: list[dict[str, Any]] = []  # what each build saw, for the tests

    def nptype(dtype: Any) -> Any:
        return NUMPY[trt.DataType(dtype).name]

    trt.nptype = nptype

    class Logger:
        WARNING = 2

        def __init__(self, severity: int = 2) -> None:
            self.severity = severity

    class Tensor:
        def __init__(self, name: str, dtype: Any, shape: list[int]) -> None:
            self.name, self.dtype, self.shape = name, dtype, shape

    class Network:
        def __init__(self, flags: int) -> None:
            self.flags, self.inputs, self.outputs, self.onnx = flags, [], [], b""

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        @property
        def num_outputs(self) -> int:
            return len(self.outputs)

        def get_input(self, i: int) -> Tensor:
            return self.inputs[i]

        def get_output(self, i: int) -> Tensor:
            return self.outputs[i]

    class ParserError:
        def __init__(self, text: str) -> None:
            self.text = text

        def __str__(self) -> str:
            return self.text

    class OnnxParser:
        def __init__(self, network: Network, logger: Logger) -> None:
            self.network, self.errors = network, []

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i: int) -> ParserError:
            return self.errors[i]

        def parse_from_file(self, path: str) -> bool:
            try:
                model = onnx.load(path)
            except Exception as exc:
                self.errors.append(ParserError(f"ModelImporter: {exc}"))
                return False
            init = {i.name for i in model.graph.initializer}

            def tensor(v: Any) -> Tensor:
                t = v.type.tensor_type
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
                return Tensor(v.name, trt.DataType[ONNX_TO_TRT[t.elem_type]], dims)

            self.network.inputs = [tensor(v) for v in model.graph.input if v.name not in init]
            self.network.outputs = [tensor(v) for v in model.graph.output]
            self.network.onnx = model.SerializeToString()
            self.network.initializer_types = sorted({i.data_type for i in model.graph.initializer})
            return True

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
            if not (len(lo) == len(opt) == len(hi)) or not all(
                a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)
            ):
                raise ValueError(f"{name}: need min <= opt <= max")
            self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = bytes(data) or b"TC:" + version.encode()

        def serialize(self) -> bytes:
            return self.data + b"+"

    class IProgressMonitor:
        def __init__(self) -> None:
            pass

    class IInt8EntropyCalibrator2:
        def __init__(self) -> None:
            pass

    trt.IProgressMonitor = IProgressMonitor
    if major == 10:
        trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2

    class Config:
        def __init__(self) -> None:
            self.flags, self.profiles, self.pools, self.cache = set(), [], {}, None
            self.progress_monitor = None
            self.builder_optimization_level = 3
            self.hardware_compatibility_level = trt.HardwareCompatibilityLevel.NONE
            if major == 10:
                self.int8_calibrator = None

        def set_flag(self, flag: Any) -> None:
            self.flags.add(trt.BuilderFlag(flag).name)

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            self.pools[trt.MemoryPoolType(pool).name] = size

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, data: bytes) -> TimingCache:
            return TimingCache(data)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            if not cache.data.startswith(b"TC:" + version.encode()) and not ignore_mismatch:
                return False  # a cache from another TensorRT/GPU
            self.cache = cache
            return True

        def get_timing_cache(self) -> TimingCache:
            return self.cache

        def set_calibration_profile(self, profile: Profile) -> None:
            self.calibration_profile = profile

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> Network:
            return Network(flags)

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
            dynamic = [t.name for t in network.inputs if -1 in t.shape]
            for profile in config.profiles:
                if set(dynamic) - set(profile.shapes):
                    return None  # TensorRT: "input has dynamic shape but no optimization profile"
            monitor = config.progress_monitor
            if monitor is not None:
                monitor.phase_start("Building engine", None, 3)
                for step in range(3):
                    if not monitor.step_complete("Building engine", step):
                        monitor.phase_finish("Building engine")
                        return None
                monitor.phase_finish("Building engine")
            level = trt.HardwareCompatibilityLevel(config.hardware_compatibility_level).name
            trt.built.append(
                {
                    "flags": set(config.flags),
                    "network_flags": network.flags,
                    "pools": config.pools,
                    "initializer_types": network.initializer_types,
                    "cache": config.cache,
                    "level": config.builder_optimization_level,
                    "hardware": level,
                }
            )
            meta = {
                "version": version,
                "io": [(t.name, "INPUT", int(t.dtype), t.shape) for t in network.inputs]
                + [(t.name, "OUTPUT", int(t.dtype), t.shape) for t in network.outputs],
                "profiles": [{k: [list(s) for s in v] for k, v in p.shapes.items()} for p in config.profiles],
            }
            return b"FAKEPLAN" + json.dumps(meta).encode() + b"\n" + network.onnx

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine, self.shapes, self.addresses, self.profile = engine, {}, {}, 0

        def set_optimization_profile_async(self, index: int, stream: int) -> bool:
            self.profile = index
            return True

        def set_input_shape(self, name: str, shape: Any) -> bool:
            lo, _, hi = self.engine.get_tensor_profile_shape(name, self.profile)
            ok = len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True))
            if ok:
                self.shapes[name] = tuple(shape)
            return ok

        def set_tensor_address(self, name: str, pointer: int) -> bool:
            self.addresses[name] = pointer
            return True

        def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            outs = [n for n, (mode, *_rest) in self.engine.io.items() if mode == "OUTPUT"]
            return dict(zip(outs, self.engine.session.run(outs, feeds), strict=True))

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            mode, _, shape = self.engine.io[name]
            if mode == "INPUT":
                return self.shapes.get(name, tuple(shape))
            zeros = {n: np.zeros(s, dtype=nptype(self.engine.io[n][1])) for n, s in self.shapes.items()}
            return self._run(zeros)[name].shape

        def execute_async_v3(self, stream: int) -> bool:
            memory = FakeMemory.current
            feeds = {}
            for name, shape in self.shapes.items():
                dtype = nptype(self.engine.io[name][1])
                feeds[name] = np.frombuffer(memory.buffers[self.addresses[name]], dtype=dtype)[
                    : int(np.prod(shape))
                ].reshape(shape)
            for name, value in self._run(feeds).items():
                raw = np.ascontiguousarray(value).tobytes()
                memory.buffers[self.addresses[name]][: len(raw)] = raw
            return True

    class Engine:
        def __init__(self, meta: dict[str, Any], model: bytes) -> None:
            import onnxruntime as ort

            self.io = {name: (mode, dtype, shape) for name, mode, dtype, shape in meta["io"]}
            self.names = list(self.io)
            self.profiles = meta["profiles"]
            self.session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

        @property
        def num_io_tensors(self) -> int:
            return len(self.names)

        @property
        def num_optimization_profiles(self) -> int:
            return len(self.profiles)

        def get_tensor_name(self, i: int) -> str:
            return self.names[i]

        def get_tensor_mode(self, name: str) -> Any:
            return trt.TensorIOMode[self.io[name][0]]

        def get_tensor_dtype(self, name: str) -> Any:
            return trt.DataType(self.io[name][1])

        def get_tensor_shape(self, name: str) -> list[int]:
            return list(self.io[name][2])

        def get_tensor_profile_shape(self, name: str, index: int) -> list[tuple[int, ...]]:
            lo, opt, hi = self.profiles[index][name]
            return [tuple(lo), tuple(opt), tuple(hi)]

        def create_execution_context(self) -> Context:
            return Context(self)

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            head, _, model = bytes(data).partition(b"\n")
            if not head.startswith(b"FAKEPLAN"):
                return None
            meta = json.loads(head[len(b"FAKEPLAN") :])
            if meta["version"] != version:
                return None  # TensorRT refuses a plan built by another version
            return Engine(meta, model)

    trt.Logger, trt.Builder, trt.OnnxParser, trt.Runtime = Logger, Builder, OnnxParser, Runtime
    return trt


class FakeMemory:
    """Device memory as host byte buffers (the interface of tensorrt_build.CudaMemory)."""

    current: FakeMemory

    def __init__(self) -> None:
        self.buffers: dict[int, bytearray] = {}
        self.next = 4096
        self.freed: list[int] = []
        FakeMemory.current = self

    def alloc(self, nbytes: int) -> int:
        pointer, self.next = self.next, self.next + max(nbytes, 1) + 256
        self.buffers[pointer] = bytearray(max(nbytes, 1))
        return pointer

    def free(self, pointer: int) -> None:
        self.freed.append(pointer)

    def stream(self) -> int:
        return 7

    def to_device(self, pointer: int, array: np.ndarray, stream: int = 0) -> None:
        raw = np.ascontiguousarray(array).tobytes()
        self.buffers[pointer][: len(raw)] = raw

    def to_host(self, array: np.ndarray, pointer: int, stream: int = 0) -> None:
        array[...] = np.frombuffer(self.buffers[pointer][: array.nbytes], dtype=array.dtype).reshape(array.shape)

    def synchronize(self, stream: int) -> None:
        pass


GPU = tensorrt_build.GpuInfo("NVIDIA A10G", "8.6")


@pytest.fixture(params=["10.3.0", "11.3.0"])
def trt(request, monkeypatch) -> types.ModuleType:
    fake = make_fake_tensorrt(request.param)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(tensorrt_build, "CudaMemory", FakeMemory)
    monkeypatch.setattr(tensorrt_build, "gpu_info", lambda device=0, run=None: GPU)
    return fake


def encoder_onnx(path: Path) -> Path:
    """ids[batch, sequence] INT64 -> hidden[batch, sequence, 4] FP32 (Gather from a table, then MatMul)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    weight = rng.standard_normal((4, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("MatMul", ["emb", "w"], ["hidden"])],
        "encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", 4])],
        [helper.make_tensor("table", TensorProto.FLOAT, [10, 4], table.flatten()),
         helper.make_tensor("w", TensorProto.FLOAT, [4, 4], weight.flatten())],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


PROFILE = {"batch": AxisRange(1, 4, 8), "sequence": AxisRange(1, 16, 32)}


# --- profiles, sidecar, compatibility (no TensorRT at all) ---------------------------------------------


def test_parse_profile_and_its_errors():
    assert parse_profile("batch=1:4:8, sequence=16") == {"batch": AxisRange(1, 4, 8), "sequence": AxisRange(16, 16, 16)}
    for bad in ("batch=8:4:1", "batch", "batch=1:2", "batch=a:b:c", ""):
        with pytest.raises(ProfileError):
            parse_profile(bad)


def test_profile_from_recipe_bounds_and_batching():
    profile = recipe_profile({"sequence": (1, 128, 512)}, max_batch_size=16, preferred_batch_sizes=(8, 4))
    assert profile == {"sequence": AxisRange(1, 128, 512), "batch": AxisRange(1, 8, 16)}
    assert parse_profile(profile_text(profile)) == profile


def test_input_shapes_from_named_axes():
    assert input_shapes("ids", ["batch", "sequence", 4], PROFILE) == ((1, 1, 4), (4, 16, 4), (8, 32, 4))
    with pytest.raises(ProfileError, match="no range for axis 'sequence'"):
        input_shapes("ids", ["batch", "sequence"], {"batch": AxisRange(1, 1, 1)})
    with pytest.raises(ProfileError, match="dynamic without a name"):
        input_shapes("ids", ["batch", None], PROFILE)


def sidecar(**changes: Any) -> Sidecar:
    base = Sidecar("10.3.0", "NVIDIA A10G", "8.6", "fp16", False, [], [], [], "0" * 64)
    for key, value in changes.items():
        setattr(base, key, value)
    return base


@pytest.mark.parametrize(
    ("built", "runtime", "problems"),
    [
        ({}, RuntimeInfo("10.3.0", "NVIDIA A10G", "8.6"), []),
        ({}, RuntimeInfo("10.3.1", "NVIDIA A10G", "8.6"), ["plan built with TensorRT 10.3.0"]),
        ({}, RuntimeInfo("10.3.0", "NVIDIA L4", "8.9"), ["compute capability 8.6"]),
        ({}, RuntimeInfo("10.3.0", "NVIDIA A40", "8.6"), ["plan built on NVIDIA A10G, this GPU is NVIDIA A40"]),
        ({"hardware_compatibility": "same-compute-capability"}, RuntimeInfo("10.3.0", "NVIDIA A40", "8.6"), []),
        ({"hardware_compatibility": "ampere-plus"}, RuntimeInfo("10.3.0", "NVIDIA H100", "9.0"), []),
        ({"hardware_compatibility": "ampere-plus"}, RuntimeInfo("10.3.0", "Tesla T4", "7.5"), ["Ampere or newer"]),
        ({"version_compatible": True}, RuntimeInfo("10.8.0", "NVIDIA A10G", "8.6"), []),
        ({"version_compatible": True}, RuntimeInfo("11.0.0", "NVIDIA A10G", "8.6"), ["not a later release"]),
    ],
)
def test_compatibility_rules(built, runtime, problems):
    found = check_compatibility(sidecar(**built), runtime)
    assert len(found) == len(problems)
    for message, expected in zip(found, problems, strict=True):
        assert expected in message


def test_sidecar_round_trip_and_errors(tmp_path):
    plan = tmp_path / "model.plan"
    assert read_sidecar(plan) is None
    sidecar_path(plan).write_text("{")
    with pytest.raises(SidecarError, match="not readable JSON"):
        read_sidecar(plan)
    sidecar_path(plan).write_text('{"format": "other"}')
    with pytest.raises(SidecarError, match="unknown sidecar format"):
        read_sidecar(plan)


def test_gpu_info_from_nvidia_smi():
    def run(cmd, **kwargs):
        assert cmd[:2] == ["nvidia-smi", "--id=0"]
        return types.SimpleNamespace(returncode=0, stdout="NVIDIA A10G, 8.6\n", stderr="")

    assert tensorrt_build.gpu_info(0, run=run) == tensorrt_build.GpuInfo("NVIDIA A10G", "8.6")

    def broken(cmd, **kwargs):
        return types.SimpleNamespace(returncode=9, stdout="", stderr="No devices were found")

    with pytest.raises(tensorrt_build.TensorRTError, match="No devices were found"):
        tensorrt_build.gpu_info(0, run=broken)


def test_missing_tensorrt_says_where_to_build(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails
    with pytest.raises(tensorrt_build.TensorRTError, match="inside the serving image"):
        tensorrt_build.load_tensorrt()


@pytest.mark.parametrize(
    ("major", "precision", "expected"),
    [
        (10, "fp32", ([], False, False)),
        (10, "fp16", (["FP16"], False, False)),
        (10, "bf16", (["BF16"], False, False)),
        (10, "int8", (["INT8"], False, False)),
        (10, "strongly-typed", ([], True, False)),
        (11, "fp32", ([], True, False)),
        (11, "fp16", ([], True, True)),
        (11, "strongly-typed", ([], True, False)),
    ],
)
def test_precision_plan_per_version(major, precision, expected):
    assert tensorrt_build.precision_plan(major, precision) == expected


@pytest.mark.parametrize(("major", "precision"), [(11, "int8"), (11, "bf16"), (9, "fp32"), (10, "fp8")])
def test_precision_plan_refusals(major, precision):
    with pytest.raises(tensorrt_build.TensorRTError):
        tensorrt_build.precision_plan(major, precision)


# --- the builder and runner against the stand-in ------------------------------------------------------


class Recorder:
    def __init__(self, cancel: bool = False) -> None:
        self.events: list[tuple] = []
        self.cancel = cancel

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        self.events.append(("start", phase, steps))

    def step_complete(self, phase: str, step: int) -> bool:
        self.events.append(("step", phase, step))
        return not self.cancel

    def phase_finish(self, phase: str) -> None:
        self.events.append(("finish", phase))


def test_build_writes_plan_sidecar_and_timing_cache(trt, tmp_path):
    source = encoder_onnx(tmp_path / "src" / "model.onnx")
    plan = tmp_path / "repo" / "enc" / "1" / "model.plan"
    cache = tmp_path / "timing.cache"
    monitor = Recorder()
    options = tensorrt_build.BuildOptions(
        profiles=[PROFILE, {"batch": AxisRange(1, 1, 1), "sequence": AxisRange(64, 64, 128)}],
        precision="fp32",
        workspace_bytes=1 << 30,
        timing_cache=cache,
        optimization_level=4,
        hardware_compatibility="ampere-plus",
    )
    side = tensorrt_build.build_plan(source, plan, options, monitor=monitor)
    assert plan.is_file()
    assert read_sidecar(plan) == side
    assert (side.tensorrt_version, side.gpu_name, side.compute_capability) == (trt.__version__, "NVIDIA A10G", "8.6")
    assert side.inputs == [{"name": "ids", "dtype": "INT64", "shape": ["batch", "sequence"]}]
    assert side.outputs == [{"name": "hidden", "dtype": "FP32", "shape": ["batch", "sequence", 4]}]
    assert side.profiles == [
        {"ids": {"min": [1, 1], "opt": [4, 16], "max": [8, 32]}},
        {"ids": {"min": [1, 64], "opt": [1, 64], "max": [1, 128]}},
    ]
    built = trt.built[-1]
    assert built["pools"] == {"WORKSPACE": 1 << 30}
    assert built["level"] == 4
    assert built["hardware"] == "AMPERE_PLUS"
    assert built["flags"] == set()
    assert built["network_flags"] == (0 if trt.__version__.startswith("10") else 2)  # 11: always strongly typed
    assert monitor.events == [("start", "Building engine", 3), *[("step", "Building engine", i) for i in range(3)],
                              ("finish", "Building engine")]  # fmt: skip
    assert cache.read_bytes() == b"TC:" + trt.__version__.encode() + b"+"
    tensorrt_build.build_plan(source, plan, options)  # a second build reads the cache written by the first
    assert trt.built[-1]["cache"].data == b"TC:" + trt.__version__.encode() + b"+"


def test_timing_cache_from_another_version_is_replaced(trt, tmp_path):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"TC:9.9.9")
    options = tensorrt_build.BuildOptions(profiles=[PROFILE], timing_cache=cache)
    tensorrt_build.build_plan(encoder_onnx(tmp_path / "m.onnx"), tmp_path / "model.plan", options)
    assert cache.read_bytes() == b"TC:" + trt.__version__.encode() + b"+"


def test_fp16_on_10_is_a_builder_flag_and_on_11_an_fp16_graph(trt, tmp_path):
    options = tensorrt_build.BuildOptions(profiles=[PROFILE], precision="fp16")
    side = tensorrt_build.build_plan(encoder_onnx(tmp_path / "m.onnx"), tmp_path / "model.plan", options)
    built = trt.built[-1]
    if trt.__version__.startswith("10"):
        assert built["flags"] == {"FP16"}
        assert built["initializer_types"] == [TensorProto.FLOAT]
        assert side.extra["fp16_cast"] is False
    else:
        assert built["flags"] == set()
        assert TensorProto.FLOAT16 in built["initializer_types"]
        assert side.extra["fp16_cast"] is True
        assert side.strongly_typed
    assert side.inputs[0]["dtype"] == "INT64"
    assert side.outputs[0]["dtype"] == "FP32"  # I/O types unchanged


def test_int8_needs_calibration_on_10_and_a_qdq_graph_on_11(trt, tmp_path):
    options = tensorrt_build.BuildOptions(profiles=[PROFILE], precision="int8")
    with pytest.raises(
        tensorrt_build.TensorRTError, match="calibration data" if trt.__version__[:2] == "10" else "Q/DQ"
    ):
        tensorrt_build.build_plan(encoder_onnx(tmp_path / "m.onnx"), tmp_path / "model.plan", options)


def test_build_errors(trt, tmp_path):
    source = encoder_onnx(tmp_path / "m.onnx")
    plan = tmp_path / "model.plan"
    with pytest.raises(ProfileError, match="no range for axis 'sequence'"):
        tensorrt_build.build_plan(source, plan, tensorrt_build.BuildOptions(profiles=[{"batch": AxisRange(1, 2, 4)}]))
    with pytest.raises(tensorrt_build.TensorRTError, match="at least one optimization profile"):
        tensorrt_build.build_plan(source, plan, tensorrt_build.BuildOptions(profiles=[]))
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not onnx")
    with pytest.raises(SignatureError, match="not a readable ONNX model"):
        tensorrt_build.build_plan(broken, plan, tensorrt_build.BuildOptions(profiles=[PROFILE]))
    with pytest.raises(tensorrt_build.TensorRTError, match="could not build"):  # the monitor cancelled the build
        tensorrt_build.build_plan(
            source, plan, tensorrt_build.BuildOptions(profiles=[PROFILE]), monitor=Recorder(cancel=True)
        )
    assert not plan.exists()


def test_runner_uses_name_based_io_and_picks_the_fitting_profile(trt, tmp_path):
    source = encoder_onnx(tmp_path / "m.onnx")
    plan = tmp_path / "model.plan"
    options = tensorrt_build.BuildOptions(
        profiles=[PROFILE, {"batch": AxisRange(1, 1, 2), "sequence": AxisRange(33, 64, 128)}]
    )
    tensorrt_build.build_plan(source, plan, options)
    memory = FakeMemory()
    run = tensorrt_build.plan_runner(plan, memory=memory)
    import onnxruntime as ort

    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    for shape in ((3, 10), (2, 100)):  # the second only fits profile 1
        ids = np.random.default_rng(1).integers(0, 10, size=shape)
        got = run({"ids": ids})["hidden"]
        np.testing.assert_allclose(got, session.run(["hidden"], {"ids": ids})[0], rtol=1e-6)
    assert len(memory.freed) == 4  # every buffer released
    with pytest.raises(tensorrt_build.TensorRTError, match="fit none of the plan's optimization profiles"):
        run({"ids": np.zeros((9, 10), dtype=np.int64)})


def test_plan_from_another_version_does_not_load(trt, tmp_path):
    plan = tmp_path / "model.plan"
    tensorrt_build.build_plan(encoder_onnx(tmp_path / "m.onnx"), plan, tensorrt_build.BuildOptions(profiles=[PROFILE]))
    other = make_fake_tensorrt("10.8.0" if trt.__version__ != "10.8.0" else "10.3.0")
    with pytest.raises(tensorrt_build.TensorRTError, match="cannot load"):
        tensorrt_build.plan_runner(plan, trt=other, memory=FakeMemory())


def test_engine_signature_names_dynamic_axes_from_the_sidecar(trt, tmp_path):
    plan = tmp_path / "model.plan"
    tensorrt_build.build_plan(encoder_onnx(tmp_path / "m.onnx"), plan, tensorrt_build.BuildOptions(profiles=[PROFILE]))
    signature = tensorrt_build.engine_signature(plan)
    assert [(t.name, t.dtype, t.shape) for t in signature.inputs] == [("ids", "INT64", ("batch", "sequence"))]
    assert [(t.name, t.dtype, t.shape) for t in signature.outputs] == [("hidden", "FP32", ("batch", "sequence", 4))]


def test_verify_plan_against_onnx_runtime(trt, tmp_path):
    source = encoder_onnx(tmp_path / "m.onnx")
    plan = tmp_path / "model.plan"
    tensorrt_build.build_plan(source, plan, tensorrt_build.BuildOptions(profiles=[PROFILE]))
    report = tensorrt_build.verify_plan(plan, source, ranges={"ids": (0, 10)}, atol=1e-5, rtol=1e-5)
    assert report.passed
    assert report.cases == 6  # min, opt, max x 2 trials
    bad = tensorrt_build.verify_plan(
        plan, source, ranges={"ids": (0, 10)}, atol=1e-5, rtol=1e-5,
        runner=lambda feeds: {"hidden": np.zeros((*feeds["ids"].shape, 4), np.float32)},
    )  # fmt: skip
    assert not bad.passed


def test_cli_builds_verifies_configures_and_the_repository_validates(trt, tmp_path):
    source = encoder_onnx(tmp_path / "src" / "enc" / "1" / "model.onnx")
    repo = tmp_path / "repo"
    result = CliRunner().invoke(
        app,
        ["convert", "tensorrt", str(source.parent.parent), "-o", str(repo), "--max-batch-size", "8",
         "--profile", "batch=1:4:8,sequence=1:16:32", "--range", "ids=0..10", "--precision", "fp16",
         "--workspace", "1GiB"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "parity ok" in result.output
    model = repo / "enc_trt"
    assert (model / "1" / "model.plan").is_file()
    assert (model / "1" / "model.plan.json").is_file()
    config = (model / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in config
    assert "KIND_GPU" in config
    assert "max_batch_size: 8" in config
    (bounds,) = validate_repository(repo)  # what the -1 dims really take, said once
    assert (bounds.severity, bounds.message) == (
        "warning",
        "1/model.plan accepts only these sizes where the config has -1 (its optimization profiles; a request "
        "outside fails at run time): input 'ids' dimension 0: 1..32",
    )
    # What the conversion decided is recorded beside the plan: `smtriton config` batches it the same way.
    regenerated = CliRunner().invoke(app, ["config", str(model), "--stdout"])
    assert regenerated.exit_code == 0, regenerated.output
    assert "max_batch_size: 8" in regenerated.stdout
    here = RuntimeInfo(trt.__version__, GPU.name, GPU.compute_capability)
    assert errors(validate_repository(repo, runtime=here)) == []
    elsewhere = RuntimeInfo(trt.__version__, "NVIDIA L4", "8.9")
    assert next(p.message for p in validate_repository(repo, runtime=elsewhere)).startswith(
        "1/model.plan: plan built on"
    )


def test_cli_needs_a_profile_for_dynamic_axes(trt, tmp_path):
    source = encoder_onnx(tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["convert", "tensorrt", str(source), "-o", str(tmp_path / "repo")])
    assert result.exit_code == 2
    assert "give --profile with the sizes the plan accepts for the dynamic axes batch, sequence" in result.output
    batched = CliRunner().invoke(app, ["convert", "tensorrt", str(source), "-o", str(tmp_path / "repo"),
                                       "--max-batch-size", "8"])  # fmt: skip
    assert batched.exit_code == 2
    assert "for the dynamic axes sequence (a recipe's axes are its parity check's sizes" in batched.output


# --- the documented call: convert onnx, then convert tensorrt SOURCE --model NAME (no --recipe) ----------


@pytest.fixture
def converted_encoder(tmp_path) -> Path:
    """repo/encoder as `smtriton convert onnx --factory ... --name encoder` writes it."""
    repo = tmp_path / "repo"
    result = CliRunner().invoke(
        app,
        ["convert", "onnx", "--factory", f"{__name__}:tiny_encoder", "--input", "ids:INT64:batch,sequence:0..10",
         "--output-tensor", "hidden", "--max-batch-size", "8", "--axis", "sequence=3", "--axis", "batch=2",
         "--trials", "1", "--name", "encoder", "-o", str(repo)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return repo


DOCUMENTED = ["--model", "encoder", "--profile", "batch=1:8:8,sequence=1:16:64", "--precision", "fp16"]


@pytest.mark.parametrize("layout", ["checkout", "installed"])
def test_the_documented_call_gets_as_far_as_tensorrt_without_a_recipe(converted_encoder, layout, monkeypatch):
    """docs/conversion.md's `smtriton convert tensorrt repo/encoder -o repo --model encoder --profile ...`:
    the entry comes from what repo/encoder records, from a checkout (the demo recipe beside, which has no
    `encoder`) and installed as a package (no recipe at all), up to the import of TensorRT."""
    from smtriton.convert import tensorrt_cli

    if layout == "installed":
        monkeypatch.setattr(tensorrt_cli, "DEFAULT_RECIPE", converted_encoder / "site-packages" / "recipe.toml")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails, as on the development machines
    repo = converted_encoder
    result = CliRunner().invoke(app, ["convert", "tensorrt", str(repo / "encoder"), "-o", str(repo), *DOCUMENTED])
    assert result.exit_code == 1
    assert result.output.startswith("error: the tensorrt Python package is not importable here"), result.output
    assert len(result.output.splitlines()) == 1
    spec = tensorrt_cli.source_entry(None, "encoder", repo / "encoder")
    assert ([t.range for t in spec.inputs], spec.max_batch_size) == ([(0, 10)], 8)


def test_the_documented_call_builds_the_plan_where_tensorrt_is(trt, converted_encoder):
    repo = converted_encoder
    result = CliRunner().invoke(app, ["convert", "tensorrt", str(repo / "encoder"), "-o", str(repo), *DOCUMENTED])
    assert result.exit_code == 0, result.output
    assert "parity ok" in result.output
    assert (repo / "encoder_trt" / "1" / "model.plan").is_file()


def test_a_model_the_source_does_not_record_is_one_line(converted_encoder, monkeypatch):
    from smtriton.convert import tensorrt_cli

    repo = converted_encoder
    args = ["convert", "tensorrt", str(repo / "encoder"), "-o", str(repo), "--model", "decoder", "--profile", "batch=1"]
    checkout = CliRunner().invoke(app, args)  # the demo recipe is asked: it has no decoder
    assert checkout.exit_code == 1
    assert "recipe.toml: no model named 'decoder' (models: " in checkout.output
    assert len(checkout.output.splitlines()) == 1
    monkeypatch.setattr(tensorrt_cli, "DEFAULT_RECIPE", repo / "site-packages" / "recipe.toml")
    installed = CliRunner().invoke(app, args)
    assert installed.exit_code == 1
    assert installed.output == (
        f"error: --model decoder: {repo / 'encoder'} records entry 'encoder', and no --recipe is given: give --recipe\n"
    )


# --- a recipe's tensorrt entry -----------------------------------------------------------------------


def tiny_encoder() -> Any:
    """ids[batch, sequence] INT64 -> hidden[batch, sequence, 4] FP32: the recipe tests' ONNX entry."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(10, 4)
            self.proj = torch.nn.Linear(4, 4, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.proj(self.table(ids))

    return Encoder().eval()


PLAN_RECIPE = f"""
[[model]]
name = "enc"
format = "onnx"
factory = "{__name__}:tiny_encoder"
max_batch_size = 8
input = [{{ name = "ids", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 10] }}]
output = [{{ name = "hidden" }}]
axes = {{ batch = [1, 2], sequence = [3, 5] }}
parity = {{ trials = 1 }}

[[model]]
name = "enc_trt"
format = "tensorrt"
onnx = "enc"
tensorrt = {{ precision = "fp16", workspace = "1GiB", profile = {{ sequence = [1, 16, 64] }} }}
"""


@pytest.fixture
def plan_recipe(tmp_path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(PLAN_RECIPE)
    return path


def test_recipe_entry_builds_the_plan_with_sidecar_parity_and_config(trt, plan_recipe, tmp_path):
    from smtriton import model_config
    from smtriton.convert.build import build_repository

    out = tmp_path / "repo"
    report = build_repository(plan_recipe, out, models=["enc_trt"])
    assert [(r.name, r.status) for r in report.results] == [("enc", "built"), ("enc_trt", "built")], report.results
    plan = out / "enc_trt" / "1" / "model.plan"
    recorded = read_sidecar(plan)
    assert recorded is not None
    assert (recorded.precision, recorded.gpu_name, recorded.max_batch_size) == ("fp16", GPU.name, 8)
    # The profile: the entry's bounds; the batch axis 1..max_batch_size, tuned for it.
    assert recorded.profiles[0]["ids"] == {"min": [1, 1], "opt": [8, 16], "max": [8, 64]}
    assert trt.built[-1]["pools"] == {"WORKSPACE": 1 << 30}
    parity = report.results[1].parity
    assert parity is not None
    assert parity.passed
    assert parity.cases == 3 * 2  # min, opt, max x 2 trials
    config = model_config.read(out / "enc_trt")
    assert (config.platform, config.max_batch_size) == ("tensorrt_plan", 8)
    assert [(g.count, model_config.model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in
            config.instance_group] == [(1, "KIND_GPU")]  # fmt: skip
    assert [i.name for i in config.input] == ["ids"]
    assert errors(validate_repository(out)) == []
    assert build_repository(plan_recipe, out).up_to_date


def test_a_plan_is_rebuilt_for_another_gpu(trt, plan_recipe, tmp_path, monkeypatch):
    from smtriton.convert.build import build_repository

    out = tmp_path / "repo"
    build_repository(plan_recipe, out)
    monkeypatch.setattr(
        tensorrt_build, "gpu_info", lambda device=0, run=None: tensorrt_build.GpuInfo("NVIDIA L4", "8.9")
    )
    assert [r.status for r in build_repository(plan_recipe, out).results] == ["up to date", "built"]


def test_without_tensorrt_the_entry_is_skipped_with_the_command_that_builds_it(plan_recipe, tmp_path, monkeypatch):
    from smtriton.convert.build import build_repository

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails, as on the development machines
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo" / "enc_trt" / "1").mkdir(parents=True)  # built elsewhere (in the image): left alone
    report = build_repository(plan_recipe, tmp_path / "repo")
    assert report.ok
    skipped = report.results[1]
    assert (skipped.name, skipped.status) == ("enc_trt", "skipped")
    assert skipped.note == (
        "TensorRT is not importable here; build the plan inside the serving image: "
        "smtriton/convert/build_tensorrt_in_image.sh IMAGE repo repo/enc --model enc "
        "--name enc_trt --max-batch-size 8 --profile sequence=1:16:64,batch=1:8:8 --precision fp16 --workspace 1GiB"
    )
    assert (tmp_path / "repo" / "enc_trt" / "1").is_dir()
    result = CliRunner().invoke(app, ["build-repository", str(plan_recipe), "--output", str(tmp_path / "repo")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "enc_trt skipped:" in line]
    assert len(lines) == 1
    assert "All 1 models up to date, 1 skipped" in result.output


def test_a_pipeline_over_a_skipped_plan_is_skipped_too(plan_recipe, tmp_path, monkeypatch):
    from smtriton.convert.build import build_repository

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    plan_recipe.write_text(
        PLAN_RECIPE
        + """
[[model]]
name = "pipe"
format = "ensemble"
max_batch_size = 8
input = [{ name = "ids", dtype = "INT64", shape = ["batch", "sequence"], range = [0, 10] }]
output = [{ name = "hidden" }]
step = [{ model = "enc_trt", input_map = { ids = "ids" }, output_map = { hidden = "hidden" } }]
"""
    )
    report = build_repository(plan_recipe, tmp_path / "repo")
    assert report.ok
    assert [(r.name, r.status) for r in report.results] == [("enc", "built"), ("enc_trt", "skipped"),
                                                            ("pipe", "skipped")]  # fmt: skip
    assert report.results[2].note == "built from 'enc_trt', which is skipped here"


def test_integer_inputs_without_a_range_take_the_values_of_the_table_they_index(trt, tmp_path):
    """No --range: token ids are drawn over the whole embedding table (10 rows), not 0 and 1 only."""
    from smtriton.repo.artifacts import onnx_index_ranges

    source = encoder_onnx(tmp_path / "m.onnx")
    assert onnx_index_ranges(source) == {"ids": (0, 10)}
    plan = tmp_path / "model.plan"
    tensorrt_build.build_plan(source, plan, tensorrt_build.BuildOptions(profiles=[PROFILE]))
    real = tensorrt_build.plan_runner(plan)
    seen: list[np.ndarray] = []

    def runner(feeds):
        seen.append(feeds["ids"])
        return real(feeds)

    assert tensorrt_build.verify_plan(plan, source, atol=1e-5, rtol=1e-5, runner=runner).passed
    values = np.concatenate([ids.ravel() for ids in seen])
    assert (values.min(), values.max()) == (0, 9)


def other_encoder_onnx(path: Path) -> Path:
    """encoder_onnx's graph with other weights: a reference no plan of encoder_onnx matches."""
    encoder_onnx(path)
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        init.CopyFrom(helper.make_tensor(init.name, init.data_type, init.dims, np.ones(np.prod(init.dims)).tolist()))
    onnx.save(model, str(path))
    return path


def test_a_plan_that_fails_parity_is_not_left_where_it_is_served(trt, tmp_path):
    source = encoder_onnx(tmp_path / "src" / "enc" / "1" / "model.onnx")
    repo = tmp_path / "repo"
    args = ["convert", "tensorrt", str(source.parent.parent), "-o", str(repo), "--max-batch-size", "8",
            "--profile", "batch=1:4:8,sequence=1:16:32"]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    version = repo / "enc_trt" / "1"
    served = {p.name: p.read_bytes() for p in version.iterdir()}
    config = (repo / "enc_trt" / "config.pbtxt").read_bytes()

    wrong = other_encoder_onnx(tmp_path / "other.onnx")
    result = CliRunner().invoke(app, [*args, "--reference", str(wrong), "--workspace", "1GiB"])
    assert result.exit_code == 1, result.output
    assert "parity FAILED" in result.output
    assert {p.name: p.read_bytes() for p in version.iterdir()} == served  # the plan in service is untouched
    assert (repo / "enc_trt" / "config.pbtxt").read_bytes() == config
    assert sorted(p.name for p in (repo / "enc_trt").iterdir()) == ["1", "config.pbtxt"]  # nothing staged is left

    fresh = CliRunner().invoke(app, [*args[:4], str(tmp_path / "new"), *args[5:], "--reference", str(wrong)])
    assert fresh.exit_code == 1
    assert not list((tmp_path / "new").rglob("model.plan*"))


def test_an_entry_without_bounds_is_refused_in_one_line_where_tensorrt_is_absent(plan_recipe, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    plan_recipe.write_text(PLAN_RECIPE.replace(", profile = { sequence = [1, 16, 64] }", ""))
    result = CliRunner().invoke(app, ["build-repository", str(plan_recipe), "--output", str(tmp_path / "repo")])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ")
    assert "model 'enc_trt': tensorrt.profile has no bounds for axis 'sequence'" in line
    assert not (tmp_path / "repo").exists()


def fixed_outside(side: dict, config: str) -> str:
    return config.replace("dims: -1", "dims: 40")


def mask_with_other_bounds(side: dict, config: str) -> str:
    side["inputs"].append({"name": "mask", "dtype": "INT64", "shape": ["batch", "sequence"]})
    side["profiles"][0]["mask"] = {"min": [1, 1], "opt": [4, 8], "max": [8, 16]}
    return config


def no_batch_of_one(side: dict, config: str) -> str:
    side["profiles"][0]["ids"]["min"] = [2, 1]
    return config


def wrong_rank(side: dict, config: str) -> str:
    side["profiles"][0]["ids"]["max"] = [8]
    return config


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (fixed_outside, "input 'ids': config dimension 0 is 40, the plan's profiles accept 1..32 there"),
        (mask_with_other_bounds, "profile 0 spans axis 'sequence' 1..32 for input 'ids' but 1..16 for input 'mask'"),
        (no_batch_of_one, "input 'ids': the plan's profiles accept batches from 2, Triton sends smaller ones"),
        (wrong_rank, "1/model.plan: profile 0 gives input 'ids' shapes that do not fit its signature"),
    ],
)
def test_validate_checks_every_dimension_of_every_profile(trt, tmp_path, edit, message):
    source = encoder_onnx(tmp_path / "src" / "enc" / "1" / "model.onnx")
    repo = tmp_path / "repo"
    args = ["convert", "tensorrt", str(source.parent.parent), "-o", str(repo), "--max-batch-size", "8",
            "--profile", "batch=1:4:8,sequence=1:16:32"]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    sidecar_file = repo / "enc_trt" / "1" / "model.plan.json"
    config_file = repo / "enc_trt" / "config.pbtxt"
    side = json.loads(sidecar_file.read_text())
    config = edit(side, config_file.read_text())
    sidecar_file.write_text(json.dumps(side))
    config_file.write_text(config)
    assert any(message in p.message for p in errors(validate_repository(repo)))
