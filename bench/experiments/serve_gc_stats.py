"""``serve`` unchanged, with the garbage collector's pauses recorded (``gc.callbacks``).

At exit each front worker writes, per generation, how many collections ran and their total and longest
pause, as JSON, to ``$BENCH_GC_STATS`` (default: ``gc-stats.json`` in the working directory; a worker
after the first adds its pid to the name). Same flags as ``serve``.
"""

import atexit
import gc
import json
import os
import socket
import time

import smtriton.serve.http.worker
from bench.experiments import serve_variant

_stats = {g: {"collections": 0, "total_ms": 0.0, "max_ms": 0.0} for g in range(3)}
_started = [0.0]


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _started[0]) * 1000
    s = _stats[info["generation"]]
    s["collections"] += 1
    s["total_ms"] += ms
    s["max_ms"] = max(s["max_ms"], ms)


def _dump() -> None:
    path = os.environ.get("BENCH_GC_STATS", "gc-stats.json")
    if os.path.exists(path):
        path = f"{path}.{os.getpid()}"
    with open(path, "w") as f:
        json.dump({"objects_tracked_at_exit": len(gc.get_objects()), "generations": _stats}, f, indent=1)


def _record() -> None:
    gc.callbacks.append(_on_gc)
    atexit.register(_dump)


def worker(index: int, channel: socket.socket) -> None:
    _record()
    smtriton.serve.http.worker.run(index, channel)


if __name__ == "__main__":
    serve_variant.run("bench.experiments.serve_gc_stats:worker")
