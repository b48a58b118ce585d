"""Data capture: asking an endpoint to capture its requests and responses, and reading what it wrote.

SageMaker writes JSON Lines to S3, one record per invocation: ``captureData.endpointInput`` and
``endpointOutput`` (``observedContentType``, ``mode``, ``data``, ``encoding``: ``JSON`` text for the
content types the configuration lists as JSON, else ``BASE64``) and ``eventMetadata`` (``eventId``,
``inferenceTime``, ``inferenceId``). Triton's binary+json bodies arrive as base64 blobs no Model Monitor
user can read; :func:`decode_record` turns every kind the container answers — JSON, JSON sent as
``application/octet-stream``, and ``application/vnd.sagemaker-triton.binary+json;json-header-size=N`` —
into named numpy tensors.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smtriton.aws.invoke import header_length
from smtriton.aws.model import is_s3
from smtriton.aws.resources import DeployError

JSON_TYPES = ("application/json",)  # captured as JSON text; the others (binary+json, octet-stream) as base64


@dataclass(frozen=True)
class DataCapture:
    destination: str  # s3://bucket/prefix
    percent: int = 100

    def check(self) -> None:
        if not is_s3(self.destination):
            raise DeployError(f"data capture destination {self.destination!r} must be an s3:// location")
        if not 0 <= self.percent <= 100:
            raise DeployError("the capture percentage must be 0-100")

    def request(self, kms_key: str | None) -> dict[str, Any]:
        """The endpoint configuration's DataCaptureConfig: inputs and outputs, JSON kept readable."""
        config: dict[str, Any] = {
            "EnableCapture": True,
            "InitialSamplingPercentage": self.percent,
            "DestinationS3Uri": self.destination,
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
            "CaptureContentTypeHeader": {"JsonContentTypes": list(JSON_TYPES)},
        }
        if kms_key:
            config["KmsKeyId"] = kms_key
        return config


class CaptureError(ValueError):
    """One captured body that cannot be decoded (the rest go on)."""


@dataclass
class Tensor:
    name: str
    datatype: str
    array: np.ndarray

    def to_json(self) -> dict[str, Any]:
        if self.array.dtype.kind in "OS":
            data = [_text(v) for v in self.array.reshape(-1).tolist()]
            data = np.array(data, dtype=object).reshape(self.array.shape).tolist()
        else:
            data = self.array.tolist()
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.array.shape), "data": data}


@dataclass
class Body:
    """One side of an invocation, decoded: the KServe header's fields and its tensors."""

    content_type: str
    header: dict[str, Any]
    tensors: list[Tensor]

    def to_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in self.header.items() if k != _tensor_key(self.header)}
        return {"content_type": self.content_type, **fields, "tensors": [t.to_json() for t in self.tensors]}


@dataclass
class Record:
    event_id: str
    metadata: dict[str, Any]
    input: Body | None
    output: Body | None


def _text(value: Any) -> Any:
    """BYTES elements as text where they are UTF-8 (JSON has no bytes), else as ``base64:...``."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    return value


def decode_body(data: bytes, content_type: str) -> Body:
    """A KServe v2 request or response body (JSON, or JSON header + binary tensors) -> its tensors."""
    try:
        size = header_length(content_type)
    except ValueError as exc:
        raise CaptureError(str(exc)) from None
    head, rest = (data, b"") if size is None else (data[:size], data[size:])
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise CaptureError(f"{content_type or 'no content type'}: not a KServe JSON body ({exc})") from None
    if not isinstance(header, dict):
        raise CaptureError("not a KServe body: the JSON is not an object")
    described = list(_tensors_with_offsets(header))
    used = sum(_binary_size(t) for t, _ in described)
    if used != len(rest):
        raise CaptureError(f"the binary part holds {len(rest)} bytes, the header describes {used}")
    return Body(content_type, header, [_tensor(t, rest, offset) for t, offset in described])


def _binary_size(tensor: Mapping[str, Any]) -> int:
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    return int(size) if size is not None else 0


def _tensor_key(header: Mapping[str, Any]) -> str:
    """A request's tensors are its inputs (its ``outputs`` only name what to return); a response's, its outputs."""
    return "inputs" if "inputs" in header else "outputs"


def _tensors_with_offsets(header: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], int]]:
    offset = 0
    tensors = header.get(_tensor_key(header), [])
    if not isinstance(tensors, list):
        raise CaptureError(f"{_tensor_key(header)} is not a list")
    for tensor in tensors:
        if not isinstance(tensor, Mapping) or "name" not in tensor:
            raise CaptureError("a tensor of the body has no name")
        yield tensor, offset
        offset += _binary_size(tensor)


def _tensor(spec: Mapping[str, Any], binary: bytes, offset: int) -> Tensor:
    from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

    name, datatype = str(spec["name"]), str(spec.get("datatype", ""))
    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise CaptureError(f"tensor {name!r}: {datatype!r} is not a Triton data type")
    try:
        shape = [int(d) for d in spec.get("shape", [])]
    except (TypeError, ValueError):
        raise CaptureError(f"tensor {name!r}: shape {spec.get('shape')!r} is not a list of sizes") from None
    size = _binary_size(spec)
    try:
        if size or "data" not in spec:
            chunk = binary[offset : offset + size]
            if datatype == "BYTES":
                flat = deserialize_bytes_tensor(chunk)
            else:  # little-endian on the wire; BF16 (ml_dtypes') widened to FP32, which JSON and .npy hold
                flat = np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<"))
                flat = flat.astype(np.float32) if datatype == "BF16" else flat
            array = np.asarray(flat).reshape(shape)
        elif datatype == "BYTES":
            array = np.array([str(v).encode() for v in np.ravel(spec["data"])], dtype=object).reshape(shape)
        else:
            array = np.asarray(spec["data"], dtype=dtype).reshape(shape)
    except (ValueError, TypeError) as exc:
        raise CaptureError(f"tensor {name!r}: {exc}") from None
    return Tensor(name, datatype, array)


def _captured_bytes(side: Mapping[str, Any]) -> bytes:
    data, encoding = side.get("data", ""), str(side.get("encoding", "")).upper()
    if encoding == "BASE64":
        try:
            return base64.b64decode(str(data), validate=True)
        except ValueError:
            raise CaptureError("data is not valid base64") from None
    if encoding in ("JSON", "CSV"):
        return (data if isinstance(data, str) else json.dumps(data)).encode()
    raise CaptureError(f"unknown encoding {side.get('encoding')!r}")


def decode_record(line: str) -> Record:
    """One line of a capture file; raises CaptureError naming the event where it can."""
    try:
        raw = json.loads(line)
        capture, metadata = raw["captureData"], dict(raw.get("eventMetadata") or {})
    except (ValueError, KeyError, TypeError):
        raise CaptureError("not a SageMaker capture record") from None
    event = str(metadata.get("eventId", "?"))
    bodies: dict[str, Body | None] = {"endpointInput": None, "endpointOutput": None}
    for key in bodies:
        side = capture.get(key)
        if side is None:
            continue
        try:
            bodies[key] = decode_body(_captured_bytes(side), str(side.get("observedContentType", "")))
        except CaptureError as exc:
            raise CaptureError(f"event {event}: {'input' if key == 'endpointInput' else 'output'}: {exc}") from None
    return Record(event, metadata, bodies["endpointInput"], bodies["endpointOutput"])


def capture_lines(source: str, s3: Any = None) -> Iterator[tuple[str, int, str]]:
    """(file, line number, line) of every capture record under a local file or folder, or an S3 prefix."""
    if source.startswith("s3://"):
        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = sorted(o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".jsonl"))
        for key in keys:
            text = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8", errors="replace")
            yield from ((f"s3://{bucket}/{key}", n, line) for n, line in enumerate(text.splitlines(), 1))
        return
    path = Path(source)
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    for file in files:
        with file.open(encoding="utf-8", errors="replace") as handle:
            yield from ((str(file), n, line.rstrip("\n")) for n, line in enumerate(handle, 1))


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def record_json(record: Record, output: Path | None = None) -> dict[str, Any]:
    """The decoded record as one JSON object; with ``output``, each tensor also written to
    ``output/<event>/<input|output>/<tensor>.npy`` and named by ``file`` instead of its ``data``."""
    result: dict[str, Any] = {
        "eventId": record.event_id,
        **{k: v for k, v in record.metadata.items() if k != "eventId"},
    }
    for side, body in (("input", record.input), ("output", record.output)):
        if body is None:
            continue
        decoded = body.to_json()
        if output is not None:
            folder = output / _file_name(record.event_id) / side
            folder.mkdir(parents=True, exist_ok=True)
            for tensor, entry in zip(body.tensors, decoded["tensors"], strict=True):
                array = tensor.array.astype(bytes) if tensor.array.dtype == object else tensor.array
                path = folder / f"{_file_name(tensor.name)}.npy"
                np.save(path, array, allow_pickle=False)
                entry.pop("data")
                entry["file"] = str(path.relative_to(output))
        result[side] = decoded
    return result
