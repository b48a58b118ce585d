"""Test model of a request-dependent answer: each text's word lengths, padded with 0 to the longest
text of the request it came in. An execution takes 20 ms, so that requests queue behind it."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            ids = [[len(word) for word in bytes(row[0]).decode().split()] for row in texts]
            width = max(len(row) for row in ids)
            padded = np.array([row + [0] * (width - len(row)) for row in ids], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("IDS", padded)]))
        return responses
