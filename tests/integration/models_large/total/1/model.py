"""Test model: the sum (in double precision) and the count of any number of FP32 values."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "VALUES").as_numpy()
            out = [
                pb_utils.Tensor("SUM", np.array([values.sum(dtype=np.float64)])),
                pb_utils.Tensor("COUNT", np.array([values.size], dtype=np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
