"""Test model, decoupled: for input N it sends N responses TOKEN=[0], [1], ... 20 ms apart.

Optional inputs make it a firehose for back-pressure tests: SIZE adds a PADDING output of SIZE bytes
to every response, GAP_MS replaces the 20 ms gap (0: as fast as Triton takes them).

If the client goes away it notices (is_cancelled) and writes `cancelled-<N>` next to this file, so a
test can tell that the Triton request did not run on after the disconnect; after sending all N it
writes `sent-<N>`, so a test can tell that the whole stream is out of the model."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _optional(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = _optional(request, "N", 0)
            size = _optional(request, "SIZE", 0)
            gap = _optional(request, "GAP_MS", 20) / 1000
            padding = np.array([b"x" * size], dtype=np.object_) if size > 0 else None
            for i in range(n):
                if sender.is_cancelled():
                    open(os.path.join(os.path.dirname(__file__), f"cancelled-{n}"), "w").close()
                    break
                outputs = [pb_utils.Tensor("TOKEN", np.array([i], dtype=np.int32))]
                if padding is not None:
                    outputs.append(pb_utils.Tensor("PADDING", padding))
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
                if gap:
                    time.sleep(gap)
            else:
                open(os.path.join(os.path.dirname(__file__), f"sent-{n}"), "w").close()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
