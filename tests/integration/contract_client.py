"""Client-side helpers the tests share: SageMaker content types and tritonclient bodies."""

from __future__ import annotations

import numpy as np
import requests
import tritonclient.http as httpclient

BJ = "application/vnd.sagemaker-triton.binary+json"


def binary_request(
    arrays: dict[str, np.ndarray], binary_outputs: dict[str, bool] | None = None, request_id: str = ""
) -> tuple[bytes, str]:
    """(body, content type) as a tritonclient user builds them for SageMaker; outputs None → all binary."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else httpclient.np_to_triton_dtype(array.dtype)
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    outputs = None
    if binary_outputs is not None:
        outputs = [httpclient.InferRequestedOutput(n, binary_data=b) for n, b in binary_outputs.items()]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id=request_id
    )
    if json_size is None:
        return body, "application/json"
    return body, f"{BJ};json-header-size={json_size}"


def parse(response: requests.Response) -> httpclient.InferResult:
    """Parse a SageMaker response with tritonclient, taking the header length from its Content-Type."""
    content_type = response.headers["content-type"]
    header_length = None
    if content_type.startswith(BJ):
        header_length = int(content_type.split("json-header-size=")[1])
    else:
        assert content_type == "application/json", content_type
    return httpclient.InferenceServerClient.parse_response_body(response.content, header_length=header_length)


def json_request(arrays: dict[str, np.ndarray], **extra: object) -> dict:
    """A KServe v2 JSON request body with every tensor's data inline."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else httpclient.np_to_triton_dtype(array.dtype)
        data = [v.decode() if isinstance(v, bytes) else v for v in array.flatten().tolist()]
        inputs.append({"name": name, "shape": list(array.shape), "datatype": datatype, "data": data})
    return {"inputs": inputs, **extra}
