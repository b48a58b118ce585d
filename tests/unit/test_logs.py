"""smtriton.serve.logs: a JSON line per record, the caller's extra fields kept, uvicorn's colour copy left out."""

from __future__ import annotations

import json
import logging

from smtriton.serve.logs import JsonFormatter


def test_extra_fields_become_keys_and_uvicorns_coloured_copy_does_not():
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Finished server process [%d]", (7,), None)
    record.color_message = "Finished server process [\x1b[36m%d\x1b[0m]"  # what uvicorn passes as extra
    record.inference_id = "abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "Finished server process [7]"
    assert line["inference_id"] == "abc"
    assert line["logger"] == "uvicorn.error"
    assert line["level"] == "INFO"
    assert "color_message" not in line
