"""Invoke a SageMaker endpoint running the serving image, through boto3's ``sagemaker-runtime``.

Requests are KServe v2 (Triton) bodies, as JSON or as SageMaker's binary+json type
(``application/vnd.sagemaker-triton.binary+json;json-header-size=N``); responses are decoded into numpy
arrays with tritonclient either way. ``target_model`` selects the archive of a multi-model endpoint,
``component`` the inference component.

    from smtriton.aws.invoke import invoke
    result = invoke(boto3.client("sagemaker-runtime"), "my-endpoint", {"INPUT0": array}, target_model="m.tar.gz")
    result.outputs["OUTPUT0"]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json"
JSON = "application/json"


@dataclass(frozen=True)
class InvokeResult:
    outputs: dict[str, np.ndarray]
    content_type: str
    model_name: str | None = None
    model_version: str | None = None
    invoked_variant: str | None = None
    header: dict[str, Any] = field(default_factory=dict)


def _triton_datatype(array: np.ndarray) -> str:
    import tritonclient.http as httpclient

    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return "BYTES"
    return httpclient.np_to_triton_dtype(array.dtype)


def encode_request(
    inputs: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    outputs: Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, str]:
    """(body, content type) of a Triton inference request; with ``binary``, tensors travel as raw bytes.

    ``outputs`` names the outputs to return (default: all); they come back binary when ``binary`` is set.
    """
    if not binary:
        return _json_request(inputs, outputs, parameters), JSON
    import tritonclient.http as httpclient

    tensors = []
    for name, value in inputs.items():
        array = np.asarray(value)
        if array.dtype.kind == "U":
            array = array.astype(object)
        tensor = httpclient.InferInput(name, list(array.shape), _triton_datatype(array))
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    requested = None
    if outputs:
        requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        tensors, outputs=requested, parameters=dict(parameters) if parameters else None
    )
    if isinstance(body, str):
        body = body.encode()
    if json_size is None:
        return body, JSON
    return body, f"{BINARY_JSON};json-header-size={json_size}"


def _json_request(
    inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None, parameters: Mapping[str, Any] | None
) -> bytes:
    """A KServe v2 JSON request with every tensor inline; outputs come back as JSON too."""
    tensors = []
    for name, value in inputs.items():
        array = np.asarray(value)
        datatype = _triton_datatype(array)
        if datatype in ("FP16", "BF16"):
            raise ValueError(f"{name}: {datatype} tensors cannot travel as JSON; send binary+json")
        if datatype == "BYTES":
            try:
                data = [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1).tolist()]
            except UnicodeDecodeError:
                message = f"{name}: BYTES that are not UTF-8 text cannot travel as JSON; send binary+json"
                raise ValueError(message) from None
        else:
            data = array.reshape(-1).tolist()
        tensors.append({"name": name, "shape": list(array.shape), "datatype": datatype, "data": data})
    request: dict[str, Any] = {"inputs": tensors}
    if outputs:
        request["outputs"] = [{"name": name} for name in outputs]
    if parameters:
        request["parameters"] = dict(parameters)
    return json.dumps(request).encode()


def header_length(content_type: str) -> int | None:
    """The JSON header size of a binary+json content type; None for plain JSON."""
    media_type, _, params = content_type.partition(";")
    if media_type.strip().lower() != BINARY_JSON:
        return None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "json-header-size":
            if not value.strip().isdecimal():
                raise ValueError(f"{content_type!r}: json-header-size {value.strip()!r} is not a size in bytes")
            return int(value.strip())
    raise ValueError(f"{content_type!r} has no json-header-size")


def decode_response(body: bytes, content_type: str) -> InvokeResult:
    """Decode a Triton response body (JSON or binary+json) into numpy arrays."""
    import tritonclient.http as httpclient

    result = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length(content_type))
    header = result.get_response()
    arrays: dict[str, np.ndarray] = {}
    for output in header.get("outputs", []):
        array = result.as_numpy(output["name"])
        if array is not None:
            arrays[output["name"]] = array
    return InvokeResult(
        outputs=arrays,
        content_type=content_type,
        model_name=header.get("model_name"),
        model_version=header.get("model_version"),
        header=header,
    )


def invoke_raw(
    client: Any,
    endpoint_name: str,
    body: bytes,
    content_type: str,
    *,
    target_model: str | None = None,
    component: str | None = None,
    custom_attributes: str | None = None,
    inference_id: str | None = None,
) -> InvokeResult:
    """Send a prepared body; decode the answer. ``component``: the inference component to run."""
    kwargs: dict[str, Any] = {"EndpointName": endpoint_name, "Body": body, "ContentType": content_type}
    if target_model:
        kwargs["TargetModel"] = target_model
    if component:
        kwargs["InferenceComponentName"] = component
    if custom_attributes:
        kwargs["CustomAttributes"] = custom_attributes
    if inference_id:
        kwargs["InferenceId"] = inference_id
    response = client.invoke_endpoint(**kwargs)
    decoded = decode_response(response["Body"].read(), response["ContentType"])
    return InvokeResult(
        outputs=decoded.outputs,
        content_type=decoded.content_type,
        model_name=decoded.model_name,
        model_version=decoded.model_version,
        invoked_variant=response.get("InvokedProductionVariant"),
        header=decoded.header,
    )


def invoke(
    client: Any,
    endpoint_name: str,
    inputs: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    outputs: Sequence[str] | None = None,
    target_model: str | None = None,
    component: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    custom_attributes: str | None = None,
    inference_id: str | None = None,
) -> InvokeResult:
    """Run one inference on a SageMaker endpoint; ``client`` is a boto3 ``sagemaker-runtime`` client."""
    body, content_type = encode_request(inputs, binary=binary, outputs=outputs, parameters=parameters)
    return invoke_raw(
        client,
        endpoint_name,
        body,
        content_type,
        target_model=target_model,
        component=component,
        custom_attributes=custom_attributes,
        inference_id=inference_id,
    )
