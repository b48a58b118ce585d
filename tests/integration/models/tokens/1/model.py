"""Test model, decoupled: for input N it sends N responses TOKEN=[0], [1], ... 20 ms apart.

If the client goes away it notices (is_cancelled) and writes `cancelled-<first token>` next to this
file, so a test can tell that the Triton request did not run on after the disconnect."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            for i in range(n):
                if sender.is_cancelled():
                    open(os.path.join(os.path.dirname(__file__), f"cancelled-{n}"), "w").close()
                    break
                token = pb_utils.Tensor("TOKEN", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[token]))
                time.sleep(0.02)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
