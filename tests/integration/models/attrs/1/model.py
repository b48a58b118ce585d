"""Test model: echoes INPUT0 and returns the custom attributes it saw as SEEN.

(Triton 2.51's Python backend cannot set response parameters; newer releases can, and `serve`
returns a `sagemaker_custom_attributes` response parameter as the header — see the unit tests.)
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seen = json.loads(request.parameters()).get("sagemaker_custom_attributes", "")
            outputs = [
                pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()),
                pb_utils.Tensor("SEEN", np.array([seen.encode()], dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
