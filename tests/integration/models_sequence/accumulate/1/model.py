"""Test sequence model: the running total of VALUE over a sequence (Triton's sequence batcher gives
every request its sequence's START, END and CORRID); a request of a sequence it never saw start fails.
The request parameter ``delay_ms`` makes a request take that long (so that one is in flight when Triton
dies)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(json.loads(request.parameters()).get("delay_ms", 0) / 1000)
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0] != 0
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0] != 0
            sequence = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0])
            if start:
                self.totals[sequence] = 0.0
            if sequence not in self.totals:
                error = pb_utils.TritonError(f"sequence {sequence} has no running total: it never started")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            self.totals[sequence] += value
            total = np.array([[self.totals[sequence]]], dtype=np.float32)
            if end:
                del self.totals[sequence]
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TOTAL", total)]))
        return responses
