"""Test model: answers its input, except 666, on which it kills its own Triton (a model that crashes
the server on one input, as a native backend's bug would)."""

import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if int(value.ravel()[0]) == 666:
                os.kill(os.getppid(), signal.SIGKILL)  # the stub's parent is tritonserver
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)]))
        return responses
