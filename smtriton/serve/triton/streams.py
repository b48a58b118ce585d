"""Streaming inference for decoupled models over Triton's gRPC stream (docs/contract.md §7, §6 B19).

Triton's HTTP ``/infer`` refuses decoupled models, and its generate API takes another request format,
so a KServe request (JSON or binary+json) for a decoupled model is re-encoded once into a gRPC
``ModelInferRequest`` — binary tensors are passed as raw bytes, JSON data goes through numpy — and each
response Triton streams back becomes one KServe JSON response (the data plane frames it as a JSON
line or a server-sent event). Only this path decodes tensors.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor, triton_to_np_dtype

from smtriton.serve.errors import BadRequest
from smtriton.serve.triton.client import RequestBody

FINAL = "triton_final_response"

# HTTP/2 flow control is the only back-pressure from a slow HTTP client to Triton: uvicorn stops taking
# chunks once its write buffer is full, this generator stops reading the call, and gRPC stops granting
# Triton window. gRPC's bandwidth-delay probing would grow that window per stream (toward 1 GiB) and
# let each stalled stream park tens of MiB in serve, so it is off and the window fixed; on loopback
# this costs no throughput (a message bigger than the window is still let through whole).
STREAM_WINDOW_BYTES = 64 * 1024
_CHANNEL_OPTIONS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES)]


def _json_tensor(tensor: dict[str, Any], datatype: str, shape: list[int]) -> bytes:
    data = tensor.get("data")
    if data is None:
        raise BadRequest(f"input '{tensor.get('name')}' has neither data nor binary_data_size")
    try:
        if datatype == "BYTES":
            flat = np.array(data, dtype=np.object_).reshape(-1)
            items = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
            array = np.array(items, dtype=np.object_).reshape(shape)
            return bytes(serialize_byte_tensor(array).tobytes())
        dtype = triton_to_np_dtype(datatype)
        if dtype is None:
            raise BadRequest(f"input '{tensor.get('name')}' has unknown datatype '{datatype}'")
        return np.asarray(data, dtype=dtype).reshape(shape).tobytes()
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"input '{tensor.get('name')}': {exc}") from None


def build_request(
    model: str, request: dict[str, Any], body: RequestBody, header_length: int | None
) -> service_pb2.ModelInferRequest:
    """The gRPC request for a KServe request: ``request`` its JSON part as read (every input's data in
    it), ``body`` and ``header_length`` where binary inputs' bytes are (None: a JSON body)."""
    if header_length == 0:
        raise BadRequest("raw binary requests cannot be streamed; send JSON or binary+json")
    end = len(body) if header_length is None else header_length
    if not isinstance(request.get("inputs"), list):
        raise BadRequest("Unable to parse 'inputs': the request needs an 'inputs' array")
    out = service_pb2.ModelInferRequest(model_name=model, id=str(request.get("id", "")))
    offset = end
    for tensor in request["inputs"]:
        if not isinstance(tensor, dict):
            raise BadRequest("each input must be an object")
        name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise BadRequest("each input needs a name, a datatype and a shape")
        out.inputs.add(name=name, datatype=datatype, shape=shape)
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(body):
                raise BadRequest(f"input '{name}': binary_data_size past the end of the body")
            out.raw_input_contents.append(body[offset : offset + size])
            offset += size
        else:
            out.raw_input_contents.append(_json_tensor(tensor, datatype, shape))
    for output in request.get("outputs") or []:
        if isinstance(output, dict) and isinstance(output.get("name"), str):
            out.outputs.add(name=output["name"])
    for key, value in (request.get("parameters") or {}).items():
        if isinstance(value, bool):
            out.parameters[key].bool_param = value
        elif isinstance(value, int):
            out.parameters[key].int64_param = value
        elif isinstance(value, str):
            out.parameters[key].string_param = value
    out.parameters["triton_enable_empty_final_response"].bool_param = True
    return out


def response_json(response: service_pb2.ModelInferResponse) -> dict[str, Any]:
    """A KServe v2 JSON response (the shape Triton's HTTP endpoint writes) for one streamed response."""
    body: dict[str, Any] = {}
    if response.id:
        body["id"] = response.id
    body["model_name"] = response.model_name
    body["model_version"] = response.model_version
    outputs = []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        shape = list(tensor.shape)
        if tensor.datatype == "BYTES":
            values = deserialize_bytes_tensor(raw)
            data = [v.decode("utf-8", errors="replace") for v in values]
        else:
            data = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype)).tolist()
        outputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": shape, "data": data})
    body["outputs"] = outputs
    return body


class StreamClient:
    """One gRPC channel to Triton, for streamed inference only; reads only as fast as clients take."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def stream(self, request: service_pb2.ModelInferRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Each response Triton streams, as a KServe JSON response (or ``{"error": ...}``, then the
        end: also when Triton cannot be reached, since the answer has started by then); closing the
        iterator early cancels the Triton request."""

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request

        call = self._stub.ModelStreamInfer(requests())
        try:
            async for message in call:
                if message.error_message:
                    yield {"error": message.error_message}
                    return
                response = message.infer_response
                final = FINAL in response.parameters and response.parameters[FINAL].bool_param
                if response.outputs:
                    yield response_json(response)
                if final:
                    return
        except grpc.aio.AioRpcError as exc:  # the answer has started: the error is its last item
            unavailable = exc.code() == grpc.StatusCode.UNAVAILABLE
            stopped = "Triton stopped while the answer streamed (it restarts on its own: send the request again)"
            yield {"error": stopped if unavailable else exc.details() or str(exc.code())}
        finally:
            call.cancel()
