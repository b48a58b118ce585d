"""What a model artifact itself declares: input/output names, Triton dtypes and shapes.

Config generation and repository validation both need the artifact's own signature, never the user's
word for it. Read without torch and without running anything, so validating a repository is fast:

- ONNX: the graph's inputs and outputs (``onnx.load`` without external weights); a graph our exporter
  wrote also records the max_batch_size it was converted for (metadata ``smtriton.signature``).
- TorchScript: a TorchScript file has no declared shapes, so our exporter stores the signature inside
  ``model.pt`` as an extra file (``extra/smtriton_signature.json``), read here with ``zipfile``.
- TensorRT: the sidecar JSON the builder writes beside the plan (the engine itself needs a GPU to read),
  and what a plan is checked against it with (its sha256, the batch sizes its profiles take).

It lives with the repository (`smtriton validate` reads artifacts) and the conversion tools import it
from here, so that `smtriton.convert` depends on `smtriton.repo` and not the other way round.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smtriton import dtypes
from smtriton.errors import ToolUsageError
from smtriton.serve.triton.tensorrt_sidecar import Sidecar, SidecarError, read_sidecar

# A dimension: int = fixed size, str = named dynamic axis, None = dynamic without a name.
SigDim = int | str | None

TORCHSCRIPT_SIGNATURE = "smtriton_signature.json"  # extra file name inside model.pt
ONNX_SIGNATURE_KEY = "smtriton.signature"  # metadata_props key of model.onnx holding the same JSON
SIGNATURE_FORMAT = "smtriton.signature/1"

# Triton platform (or backend) -> the file its backend loads unless default_model_filename says otherwise.
DEFAULT_FILENAMES: dict[str, str] = {
    "onnxruntime_onnx": "model.onnx",
    "onnxruntime": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "pytorch": "model.pt",
    "tensorrt_plan": "model.plan",
    "tensorrt": "model.plan",
    "python": "model.py",
}
# Artifact file -> (ModelConfig field, value) for configs generated from an artifact.
PLATFORM_OF_FILE: dict[str, tuple[str, str]] = {
    "model.onnx": ("platform", "onnxruntime_onnx"),
    "model.pt": ("platform", "pytorch_libtorch"),
    "model.plan": ("platform", "tensorrt_plan"),
    "model.py": ("backend", "python"),
}


class SignatureError(ToolUsageError, ValueError):
    """The artifact cannot be read, or declares something a Triton config cannot express."""


@dataclass(frozen=True)
class TensorSig:
    name: str
    dtype: str  # Triton name: FP32, INT64, BYTES, ...
    shape: tuple[SigDim, ...]

    def is_dynamic(self, index: int) -> bool:
        return not isinstance(self.shape[index], int) or self.shape[index] == -1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": [-1 if d is None else d for d in self.shape]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSig:
        shape = tuple(None if d == -1 else d for d in data["shape"])
        return cls(str(data["name"]), str(data["dtype"]), shape)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]
    source: str  # where it was read, for messages: "ONNX graph", "TorchScript signature", ...
    max_batch_size: int | None = None  # when the artifact records the batching it was exported for

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": SIGNATURE_FORMAT,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }
        if self.max_batch_size is not None:
            data["max_batch_size"] = self.max_batch_size
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str) -> Signature:
        try:
            return cls(
                tuple(TensorSig.from_dict(t) for t in data["inputs"]),
                tuple(TensorSig.from_dict(t) for t in data["outputs"]),
                source,
                data.get("max_batch_size"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SignatureError(f"{source}: malformed signature ({exc})") from None


def onnx_signature(path: Path) -> Signature:
    """Inputs (initializers excluded) and outputs of an ONNX graph; weights are not loaded."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError, ...
        raise SignatureError(f"not a readable ONNX model: {exc}") from None
    initializers = {i.name for i in model.graph.initializer}

    def sig(value: Any) -> TensorSig:
        tensor_type = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise SignatureError(f"{value.name!r} is not a tensor (sequences and maps have no Triton type)")
        try:
            elem = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        except ValueError:
            elem = str(tensor_type.elem_type)
        dtype = dtypes.ONNX_TYPES.get(elem)
        if dtype is None:
            raise SignatureError(f"{value.name!r} has ONNX type {elem}, which no Triton tensor type holds")
        dims: list[SigDim] = []
        for d in tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or None)
        return TensorSig(value.name, dtype, tuple(dims))

    inputs = tuple(sig(v) for v in model.graph.input if v.name not in initializers)
    recorded = next((p.value for p in model.metadata_props if p.key == ONNX_SIGNATURE_KEY), None)
    max_batch_size = None
    if recorded is not None:  # what `smtriton convert onnx` decided; the graph itself stays the authority on I/O
        try:
            max_batch_size = json.loads(recorded).get("max_batch_size")
        except (ValueError, AttributeError):
            raise SignatureError(f"unreadable {ONNX_SIGNATURE_KEY} metadata") from None
    return Signature(inputs, tuple(sig(v) for v in model.graph.output), "ONNX graph", max_batch_size)


# Nodes an index tensor may pass through unchanged in value on its way to a Gather.
_VALUE_PRESERVING = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def onnx_index_ranges(path: Path) -> dict[str, tuple[int, int]]:
    """``[0, rows)`` for each integer graph input that indexes a table (``Gather`` on an initializer, as
    an embedding exports): the values a realistic input takes, read from the graph (weights not loaded)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    sizes = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and node.output and value is not None:
            sizes[node.output[0]] = list(value.dims)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    ranges = {}
    for value in graph.input:
        rows = _rows_indexed(value.name, consumers, sizes) if value.name not in sizes else []
        if rows:
            ranges[value.name] = (0, min(rows))
    return ranges


def _rows_indexed(start: str, consumers: Mapping[str, list[Any]], sizes: Mapping[str, list[int]]) -> list[int]:
    """The sizes of the tables ``start`` indexes, directly or through value-preserving nodes."""
    rows: list[int] = []
    pending, seen = [start], {start}
    while pending:
        tensor = pending.pop()
        for node in consumers.get(tensor, []):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                table = sizes.get(node.input[0])
                if table and -len(table) <= axis < len(table) and table[axis] > 0:
                    rows.append(int(table[axis]))
            elif node.op_type in _VALUE_PRESERVING and node.input[0] == tensor:
                fresh = [out for out in node.output if out not in seen]
                seen.update(fresh)
                pending.extend(fresh)
    return rows


def onnx_external_data(path: Path) -> list[str]:
    """Relative locations of the external weight files an ONNX graph refers to."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            if "location" in entries:
                locations.add(entries["location"])
    return sorted(locations)


def torchscript_signature(path: Path) -> Signature | None:
    """The signature our exporter stored inside ``model.pt``; None for a TorchScript file without one."""
    try:
        with zipfile.ZipFile(path) as archive:
            member = next((n for n in archive.namelist() if n.endswith(f"/extra/{TORCHSCRIPT_SIGNATURE}")), None)
            if member is None:
                return None
            data = json.loads(archive.read(member))
    except (zipfile.BadZipFile, OSError) as exc:
        raise SignatureError(f"not a TorchScript archive: {exc}") from None
    except ValueError as exc:
        raise SignatureError(f"unreadable {TORCHSCRIPT_SIGNATURE}: {exc}") from None
    return Signature.from_dict(data, "TorchScript signature")


def signature_json(inputs: Sequence[TensorSig], outputs: Sequence[TensorSig], max_batch_size: int) -> str:
    """The text stored as the TorchScript extra file."""
    return json.dumps(Signature(tuple(inputs), tuple(outputs), "", max_batch_size).to_dict(), sort_keys=True)


def plan_signature(path: Path) -> Signature | None:
    """The I/O recorded in a TensorRT plan's sidecar; None without a sidecar."""
    try:
        sidecar = read_sidecar(path)
    except SidecarError as exc:
        raise SignatureError(str(exc)) from None
    if sidecar is None:
        return None
    data = {"inputs": sidecar.inputs, "outputs": sidecar.outputs, "max_batch_size": sidecar.max_batch_size}
    return Signature.from_dict(data, "TensorRT sidecar")


def artifact_signature(path: Path) -> Signature | None:
    """Dispatch on the file name; None when the artifact carries no signature this tool can read."""
    if path.suffix == ".onnx":
        return onnx_signature(path)
    if path.suffix in (".pt", ".pth", ".torchscript"):
        return torchscript_signature(path)
    if path.suffix in (".plan", ".engine"):
        return plan_signature(path)
    return None


def find_artifact(model_dir: Path, version: str | None = None) -> Path:
    """The artifact of a model directory: in ``version`` or else the highest numeric version."""
    versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if version is not None:
        versions = [p for p in versions if p.name == version]
    if not versions:
        raise SignatureError(f"{model_dir}: no numeric version directory" + (f" {version}" if version else ""))
    found = [versions[-1] / f for f in PLATFORM_OF_FILE if (versions[-1] / f).is_file()]
    if len(found) != 1:
        names = ", ".join(PLATFORM_OF_FILE)
        what = "none" if not found else ", ".join(p.name for p in found)
        raise SignatureError(f"{versions[-1]}: expected exactly one of {names}; found {what}")
    return found[0]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def profile_batch_limits(sidecar: Sidecar) -> dict[str, int]:
    """Largest first-dimension size each input accepts across the plan's profiles."""
    limits: dict[str, int] = {}
    for profile in sidecar.profiles:
        for name, ranges in profile.items():
            if ranges.get("max"):
                limits[name] = max(limits.get(name, 0), int(ranges["max"][0]))
    return limits
