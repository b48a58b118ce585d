"""Logging: one JSON object per line on stdout (CloudWatch reads each line as an event), or text.

Records may carry extra fields (``extra={"inference_id": ...}``); they become JSON keys. Request
bodies are never logged anywhere in `serve`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Literal

import orjson

# Record attributes that are not the caller's extra fields; uvicorn's ``color_message`` is its own message
# again with ANSI colour codes, noise in a JSON line.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class _NoPing(logging.Filter):
    """SageMaker pings every few seconds; those lines would drown the access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(a, str) and a.split("?", 1)[0] == "/ping" for a in args)


class _Worker(logging.Filter):
    """Names the front worker on each of its records (the main process's records name none)."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


def configure_logging(level: str, fmt: Literal["json", "text"], worker: int | None = None) -> None:
    """Logging of `serve`'s main process, or of front worker ``worker`` (its lines carry ``"worker"``)."""
    handler = logging.StreamHandler(sys.stdout)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        where = "" if worker is None else f" [worker {worker}]"
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s"))
    if worker is not None:
        handler.addFilter(_Worker(worker))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("uvicorn.access").addFilter(_NoPing())


_access = logging.getLogger("serve.access")


def log_failure(method: str, path: str, status: int, inference_id: str | None) -> None:
    """One line per failed request, with SageMaker's inference id; never the body."""
    _access.info("%s %s answered %d", method, path, status, extra={"status": status, "inference_id": inference_id})
