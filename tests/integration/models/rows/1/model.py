"""Test model for batch transform: rows of any length in, each doubled and its total out; a request holding
the value -999 fails (a record the model refuses)."""

import numpy as np
import triton_python_backend_utils as pb_utils

REFUSED = -999.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (rows == REFUSED).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("the model refuses -999")))
                continue
            doubled = pb_utils.Tensor("OUTPUT0", (rows * 2).astype(np.float32))
            total = pb_utils.Tensor("TOTAL", rows.sum(axis=1, keepdims=True).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[doubled, total]))
        return responses
