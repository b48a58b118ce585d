"""Baseline: the SageMaker proxy users typically write themselves — FastAPI, a sync route, tritonclient.http.

Run: BENCH_TRITON_URL=127.0.0.1:8000 BENCH_MODEL=m uvicorn bench.proxy_app:app --workers 1
"""

import json
import os
import threading

import numpy as np
import tritonclient.http as httpclient
from fastapi import Depends, FastAPI, Request, Response
from tritonclient.utils import triton_to_np_dtype

URL, MODEL = os.environ["BENCH_TRITON_URL"], os.environ["BENCH_MODEL"]
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="
OUTPUTS = [o["name"] for o in httpclient.InferenceServerClient(URL).get_model_metadata(MODEL)["outputs"]]
app = FastAPI()
local = threading.local()  # tritonclient clients are not thread-safe: one per threadpool thread


def client() -> httpclient.InferenceServerClient:
    if not hasattr(local, "client"):
        local.client = httpclient.InferenceServerClient(URL)
    return local.client


async def raw_body(request: Request) -> bytes:
    return await request.body()


@app.get("/ping")
def ping() -> Response:
    return Response(status_code=200 if client().is_model_ready(MODEL) else 503)


@app.post("/invocations")
def invocations(request: Request, body: bytes = Depends(raw_body)) -> Response:
    content_type = request.headers.get("content-type", "")
    binary = content_type.startswith(BINARY)
    header = json.loads(body[: int(content_type[len(BINARY) :])] if binary else body)
    offset = int(content_type[len(BINARY) :]) if binary else 0
    inputs = []
    for spec in header["inputs"]:
        dtype = triton_to_np_dtype(spec["datatype"])
        if binary:
            size = spec["parameters"]["binary_data_size"]
            array = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(spec["shape"])
            offset += size
        else:
            array = np.array(spec["data"], dtype=dtype).reshape(spec["shape"])
        inputs.append(httpclient.InferInput(spec["name"], spec["shape"], spec["datatype"]))
        inputs[-1].set_data_from_numpy(array)
    names = [o["name"] for o in header.get("outputs") or []] or OUTPUTS
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in names]
    result = client().infer(MODEL, inputs, outputs=outputs)
    head = json.dumps(result.get_response()).encode()
    if not binary:
        return Response(head, media_type="application/json")
    data = b"".join(result.as_numpy(o["name"]).tobytes() for o in result.get_response()["outputs"])
    return Response(head + data, media_type=f"{BINARY}{len(head)}")
