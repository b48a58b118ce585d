"""Test model of merged requests: each output row depends on its input row alone, in every datatype
(FP32, FP64, INT64, BYTES, BOOL). A row whose I holds 13 fails its request; the request parameter
``delay_ms`` makes an execution take that long (so that requests queue behind it)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            delay_ms = json.loads(request.parameters()).get("delay_ms", 0)
            if delay_ms:
                time.sleep(delay_ms / 1000)
            f = pb_utils.get_input_tensor_by_name(request, "F").as_numpy()
            i = pb_utils.get_input_tensor_by_name(request, "I").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            if (i == 13).any():
                rows = sorted({int(r) for r in np.nonzero(i == 13)[0]})
                error = pb_utils.TritonError(f"13 in row {rows} of a request of {len(i)} rows")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [
                pb_utils.Tensor("F2", (f * np.float32(3) - np.float32(1)).astype(np.float32)),
                pb_utils.Tensor("FSUM", f.astype(np.float64).sum(axis=1, keepdims=True) / 3),
                pb_utils.Tensor("I2", i * 2 + 1),
                pb_utils.Tensor("S2", np.array([[bytes(x)[::-1] + b"!" for x in row] for row in s], dtype=object)),
                pb_utils.Tensor("B2", np.logical_not(b)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
