"""Drive one server with wrk (bench/post.lua) and account for every CPU second spent meanwhile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.servers import LOOPBACK, Server, cpu_seconds, loadavg, machine_busy_seconds, triton_stats

LUA = Path(__file__).with_name("post.lua")
WRK_TIMEOUT = "10s"  # a request slower than this counts as an error


class WrkMissing(RuntimeError):
    pass


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise WrkMissing("wrk not found: install it (Debian/Ubuntu: apt-get install -y wrk) or put it on PATH")
    return found


@dataclass
class Measurement:
    requests: int
    seconds: float
    throughput: float  # requests per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int  # socket errors + non-2xx/3xx answers + timeouts
    error_detail: dict[str, int]
    wrk_cpu: float  # wrk's CPU seconds / wall seconds (1.0 = one core busy)
    front_cpu_ms: float | None  # per request: the Python front (ours / proxy); None for the anchor
    triton_cpu_ms: float  # per request: tritonserver + its Python backend stubs
    other_cpu: float  # cores busy with anything else on the machine (other users), on average
    loadavg_before: tuple[float, float, float]
    # Triton's statistics over the run (None where it has none: /ping, or a model it does not report):
    triton_batch: float | None = None  # mean rows an execution of the model ran (inferences / executions)
    triton_requests: float | None = None  # requests Triton answered per request the client sent

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def run_wrk(
    server: Server,
    path: str,
    connections: int,
    duration: float,
    body_file: Path | None,
    content_type: str,
    method: str = "POST",
) -> Measurement:
    """One wrk run of ``duration`` seconds at ``connections`` concurrent connections (one wrk thread)."""
    env = {**os.environ, "BENCH_METHOD": method, "BENCH_BODY": str(body_file or ""), "BENCH_CONTENT_TYPE": content_type}
    cmd = [wrk_binary(), "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", f"--timeout={WRK_TIMEOUT}"]
    cmd += ["-s", str(LUA), f"http://{LOOPBACK}:{server.port}{path}"]
    load_before = loadavg()
    stats_port = server.triton_port() if path == "/invocations" else None
    stats_before = triton_stats(stats_port, server.model) if stats_port is not None else None
    roles = server.pids()
    cpu_before = cpu_seconds(roles["front"] + roles["triton"])
    busy_before, wall_before = machine_busy_seconds(), time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        timer = threading.Timer(duration + 60, proc.kill)  # never hang on a stuck client
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - wall_before
        busy = machine_busy_seconds() - busy_before
        roles_after = server.pids()
        cpu_after = cpu_seconds(roles_after["front"] + roles_after["triton"])
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    stats_after = triton_stats(stats_port, server.model) if stats_port is not None else None
    line = next((ln for ln in text.splitlines() if ln.startswith("BENCH_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {text[-2000:]}")
    raw = json.loads(line[len("BENCH_RESULT ") :])

    def spent(pids: list[int]) -> float:
        # Processes born during the run (a restarted stub) count from zero.
        return sum(cpu_after.get(p, 0.0) - cpu_before.get(p, 0.0) for p in set(pids) if p in cpu_after)

    front = spent(roles["front"] + roles_after["front"])
    triton = spent(roles["triton"] + roles_after["triton"])
    wrk_cpu = usage.ru_utime + usage.ru_stime
    requests = int(raw["requests"])
    seconds = raw["duration_us"] / 1e6
    per = 1000.0 / max(requests, 1)
    detail = {k: int(raw[k]) for k in ("connect", "read", "write", "status", "timeout")}
    batch = triton_requests = None
    if stats_before is not None and stats_after is not None:
        executions = stats_after["executions"] - stats_before["executions"]
        batch = (stats_after["inferences"] - stats_before["inferences"]) / executions if executions else None
        triton_requests = (stats_after["requests"] - stats_before["requests"]) / max(requests, 1)
    return Measurement(
        requests=requests,
        seconds=seconds,
        throughput=requests / seconds if seconds else 0.0,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        mean_ms=raw["mean_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        errors=sum(detail.values()),
        error_detail=detail,
        wrk_cpu=wrk_cpu / wall,
        front_cpu_ms=None if server.kind == "anchor" else front * per,
        triton_cpu_ms=triton * per,
        other_cpu=max(0.0, busy - front - triton - wrk_cpu) / wall,
        loadavg_before=load_before,
        triton_batch=batch,
        triton_requests=triton_requests,
    )
