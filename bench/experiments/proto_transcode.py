"""``proto`` plus one lever: a large JSON request is transcoded to Triton's binary form in the front.

Triton parses JSON tensor data slowly (about 24 ms of its CPU for a 1x3x224x224 FP32 image here);
orjson + numpy do it in about 12 ms. The answer stays JSON (no binary output is asked for), so the
client sees what the anchor sends. Same flags as ``proto``.
"""

from __future__ import annotations

import numpy as np
import orjson

from bench.experiments import proto
from bench.experiments.common import BINARY_PREFIX, request_header_length

TRANSCODE_ABOVE = 64 * 1024
_DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
           "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}  # fmt: skip


def transcode(body: bytes) -> tuple[bytes, int] | None:
    """(binary body, JSON header length), or None to send the JSON as it is (BYTES, odd shapes...)."""
    try:
        request = orjson.loads(body)
        parts = []
        for spec in request["inputs"]:
            dtype = _DTYPES[spec["datatype"]]
            raw = np.asarray(spec.pop("data"), dtype=dtype).tobytes()
            if len(raw) != int(np.prod(spec["shape"])) * np.dtype(dtype).itemsize:
                return None
            spec.setdefault("parameters", {})["binary_data_size"] = len(raw)
            parts.append(raw)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None  # let Triton answer with its own error
    head = orjson.dumps(request)
    return b"".join([head, *parts]), len(head)


class TranscodingFront(proto.Front):
    def on_message_complete(self) -> None:
        json_body = self.url != b"/ping" and request_header_length(self.content_type) is None
        if json_body and sum(map(len, self.chunks)) > TRANSCODE_ABOVE:
            done = transcode(b"".join(self.chunks))
            if done is not None:
                self.chunks = [done[0]]
                self.content_type = BINARY_PREFIX + b"%d" % done[1]
        super().on_message_complete()


if __name__ == "__main__":
    proto.Front = TranscodingFront  # serve() builds proto.Front
    proto.main()
