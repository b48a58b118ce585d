"""Test sequence model, decoupled: streams the running total of VALUE over a sequence, then the total
doubled (two responses per request); a request of a sequence it never saw start fails."""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0] != 0
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0] != 0
            sequence = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0])
            if start:
                self.totals[sequence] = 0.0
            if sequence not in self.totals:
                error = pb_utils.TritonError(f"sequence {sequence} has no running total: it never started")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            self.totals[sequence] += value
            total = self.totals[sequence]
            if end:
                del self.totals[sequence]
            for out in (total, 2 * total):
                tensor = pb_utils.Tensor("TOTAL", np.array([[out]], dtype=np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[tensor]))
            sender.send(flags=FINAL)
        return None
