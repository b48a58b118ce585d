"""Test model: the poison model, batched. It answers its input, except 666, on which it kills its own
Triton with every request of the same execution in flight (the dynamic batcher puts requests that reach
Triton within 100 ms in one). The request parameter ``delay_ms`` makes a request take that long; the
config parameter ``initialize_s`` makes each start take that long (a Triton slow to come back)."""

import json
import os
import signal
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        time.sleep(float(parameters.get("initialize_s", {}).get("string_value", "0")))

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(json.loads(request.parameters()).get("delay_ms", 0) / 1000)
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if int(value.ravel()[0]) == 666:
                os.kill(os.getppid(), signal.SIGKILL)  # the stub's parent is tritonserver
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)]))
        return responses
